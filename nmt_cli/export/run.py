"""`nmt export`: check the request, then hand the checkpoint to the format's converter.

CTranslate2 is an optional dependency (`pip install nmt[export]`), so it is imported here, on demand,
and its absence is a one-line error rather than an ImportError at start-up.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nmt_cli.config import ExportConfig
from nmt_cli.errors import ExportError

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    'ctranslate2 is not installed; install it with `pip install "nmt[export]"` (or `pip install ctranslate2`)'
)


def export_checkpoint(cfg: ExportConfig) -> Path:
    """Write the checkpoint `cfg.path` as a model directory of `cfg.format` at `cfg.output`; returns it.

    Raises:
        ExportError: an existing output without `force`, ctranslate2 missing, or a model setting the format
            cannot express.
    """
    checkpoint_path, output_dir, quantization = Path(cfg.path), Path(cfg.output), cfg.quantization
    if output_dir.exists() and not cfg.force:
        raise ExportError(f"--output {output_dir} already exists; remove it or pass --force")
    try:
        from nmt_cli.export.to_ctranslate2 import convert
    except ImportError as e:
        if "ctranslate2" not in str(e):
            raise
        raise ExportError(INSTALL_HINT) from None
    convert(checkpoint_path, output_dir, quantization)
    logger.info(
        "wrote the CTranslate2 model %s (quantization %s) from %s",
        output_dir,
        quantization or "float32",
        checkpoint_path,
    )
    return output_dir
