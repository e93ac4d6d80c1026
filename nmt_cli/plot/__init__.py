"""`nmt plot`: attention maps of one sentence (attention.py) and learning curves of training logs (curves.py).
matplotlib is an optional extra (`nmt[plot]`), imported on first use (`pyplot`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from nmt_cli.errors import ConfigError, DataError, NmtError

logger = logging.getLogger(__name__)
FORMATS = (".png", ".svg", ".pdf")


class MissingDependencyError(NmtError):
    """An optional package that a command needs is not installed."""


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (writes files, needs no display); its absence is one error line."""
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError('nmt plot needs matplotlib: pip install "nmt[plot]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_output(output: Path) -> None:
    if output.suffix.lower() not in FORMATS:
        raise ConfigError(f"--output {output} must end in {', '.join(FORMATS)}")


def save_figure(fig: Any, output: Path) -> None:
    try:
        fig.savefig(output, dpi=110)
    except OSError as e:
        raise DataError(f"cannot write --output {output}: {e.strerror or e}") from None
    logger.info("wrote %s", output)
