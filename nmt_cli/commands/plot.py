"""`nmt plot attention` and `nmt plot curves`: the options' checks, then the figure (plot/; needs matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nmt_cli.errors import ConfigError


def plot_attention(checkpoint: Path, sentence: str, layer: int | None, head: str, output: Path) -> None:
    """One sentence's attention maps; head: a head number (from 1) or "all"."""
    from nmt_cli.plot.attention import attention_figure

    if head != "all" and not (head.isdigit() and int(head) >= 1):
        raise ConfigError(f"--head {head!r} must be a head number (from 1) or all")
    attention_figure(checkpoint, sentence, layer, None if head == "all" else int(head), output)


def plot_curves(log_files: Sequence[Path], labels: Sequence[str], output: Path) -> None:
    """Learning curves of one or more training logs, labelled by `labels` (default: the files' stems)."""
    from nmt_cli.plot.curves import plot_curves as draw
    from nmt_cli.plot.curves import read_log

    if labels and len(labels) != len(log_files):
        raise ConfigError(f"give one --label per --log-file ({len(labels)} labels for {len(log_files)} files)")
    names: Sequence[str | None] = labels or [None] * len(log_files)
    draw([read_log(path, label) for path, label in zip(log_files, names)], output)
