"""`nmt export`: check the request, then hand the checkpoint to the format's converter. CTranslate2 is optional
(`nmt[export]`): imported here on demand, its absence is a one-line error."""

from __future__ import annotations

import logging
from pathlib import Path

from nmt_cli.config import ExportConfig
from nmt_cli.errors import ExportError
from nmt_cli.files import directory_in_place

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    'ctranslate2 is not installed; install it with `pip install "nmt[export]"` (or `pip install ctranslate2`)'
)


# What an export writes (CTranslate2's files, also those of its other vocabulary layouts, and our
# sentencepiece model): --force replaces a directory holding nothing else, never another one.
EXPORT_FILES = frozenset(
    {"model.bin", "config.json", "sentencepiece.model"}
    | {
        f"{name}.{ext}"
        for name in ("shared_vocabulary", "source_vocabulary", "target_vocabulary")
        for ext in ("json", "txt")
    }
)


def check_output(output_dir: Path, force: bool) -> None:
    """--output must be new, or (with force) an earlier export: never a file or a directory of other things."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise ExportError(f"--output {output_dir} is a file; give the model directory to write")
    if not force:
        raise ExportError(f"--output {output_dir} already exists; remove it or pass --force")
    others = sorted(p.name for p in output_dir.iterdir() if p.name not in EXPORT_FILES)
    if others or not (output_dir / "model.bin").exists():
        held = (
            f"it holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}" if others else "it has no model.bin"
        )
        raise ExportError(
            f"--output {output_dir} is not a CTranslate2 model directory ({held}); --force replaces only an "
            "earlier export, so give a new directory"
        )


def export_checkpoint(cfg: ExportConfig) -> Path:
    """Write the checkpoint `cfg.path` as a model directory of `cfg.format` at `cfg.output`; returns it. ExportError:
    an existing output without `force`, ctranslate2 missing, or a model setting the format cannot express."""
    checkpoint_path, output_dir, quantization = Path(cfg.path), Path(cfg.output), cfg.quantization
    check_output(output_dir, cfg.force)
    try:
        from nmt_cli.export.to_ctranslate2 import convert
    except ImportError as e:
        if "ctranslate2" not in str(e):
            raise
        raise ExportError(INSTALL_HINT) from None
    # Written beside --output and renamed over it when complete: a failed or stopped export leaves an earlier one
    # intact and no temporary (one a killed export left is removed here); the earlier export (checked above)
    # goes once the new one is in place.
    with directory_in_place(output_dir, "--output", "export") as tmp:
        convert(checkpoint_path, tmp, quantization)
    logger.info(
        "wrote the CTranslate2 model %s (quantization %s) from %s",
        output_dir,
        quantization or "float32",
        checkpoint_path,
    )
    return output_dir
