"""`nmt export`: check the request, then hand the checkpoint to the format's converter.

CTranslate2 is an optional dependency (`pip install nmt[export]`), so it is imported here, on demand,
and its absence is a one-line error rather than an ImportError at start-up.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nmt_cli.errors import ExportError

logger = logging.getLogger(__name__)

FORMATS = ("ctranslate2",)
QUANTIZATIONS = ("int8", "int8_float32", "bfloat16", "float16")
INSTALL_HINT = 'ctranslate2 is not installed; install it with `pip install "nmt[export]"` (or `pip install ctranslate2`)'


def export_checkpoint(checkpoint_path: Path, fmt: str, output_dir: Path, quantization: str | None,
                      force: bool) -> Path:
    """Write `checkpoint_path` as a `fmt` model directory at `output_dir`; returns that directory.

    Raises:
        ExportError: unknown format or quantization, existing output without `force`, ctranslate2
            missing, or a model setting the format cannot express.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization {quantization!r} must be one of {', '.join(QUANTIZATIONS)}")
    if output_dir.exists() and not force:
        raise ExportError(f"--output {output_dir} already exists; remove it or pass --force")
    try:
        from nmt_cli.export.to_ctranslate2 import convert
    except ImportError as e:
        if "ctranslate2" not in str(e):
            raise
        raise ExportError(INSTALL_HINT) from None
    convert(checkpoint_path, output_dir, quantization)
    logger.info("wrote the CTranslate2 model %s (quantization %s) from %s", output_dir, quantization or "float32",
                checkpoint_path)
    return output_dir
