"""Learning curves from `nmt train --log-file` JSON lines: losses, valid BLEU, learning rate and speed, against
updates (top row) and wall clock (bottom row), several runs on one figure; `plot_curves` returns the series it
drew, the logged numbers as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt_cli.errors import DataError
from nmt_cli.plot import check_output, pyplot, save_figure

# panel title -> (event, field); a panel is drawn when some run logged its field
PANELS = {
    "loss (label-smoothed)": (("train", "loss"), ("valid", "valid_loss")),
    "valid BLEU": (("valid", "valid_bleu"),),
    "learning rate": (("train", "lr"),),
    "target tokens/s": (("train", "tgt_tok_per_s"),),
}
X_AXES = {"update": "updates", "elapsed_s": "wall clock (minutes)"}
PLOTTED = sorted({field for fields in PANELS.values() for _, field in fields})  # numbers where present


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class RunLog:
    label: str
    records: list[dict[str, Any]]  # the log's lines, in order

    def series(self, event: str, field: str, x: str) -> tuple[list[float], list[float]]:
        """(x values, y values) of the records of `event` that hold `field`; elapsed_s in minutes."""
        rows = [r for r in self.records if r.get("event") == event and r.get(field) is not None]
        return [r[x] / 60 if x == "elapsed_s" else r[x] for r in rows], [r[field] for r in rows]


def read_log(path: Path, label: str | None = None) -> RunLog:
    """One JSON-lines log of `nmt train --log-file` (a resumed run appends to it; see below); the label
    defaults to the file's stem."""
    records: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DataError(f"cannot read --log-file {path}: {e.strerror or e}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise DataError(f"{path}:{number} is not JSON; give a file written by nmt train --log-file") from None
        if not isinstance(record, dict) or any(key not in record for key in ("event", *X_AXES)):
            raise DataError(f"{path}:{number} is not an nmt train log record (no event, update or elapsed_s)")
        wrong = [key for key in (*X_AXES, *PLOTTED) if key in record and not is_number(record[key])]
        if wrong:
            raise DataError(f"{path}:{number}: {wrong[0]} is {record[wrong[0]]!r}, not a number")
        if records and record["update"] < records[-1]["update"]:
            # a resumed run logs again from its checkpoint's update on: its records replace those that the
            # interrupted run wrote past that point (updates whose work the checkpoint did not keep)
            records = [r for r in records if r["update"] < record["update"]]
        records.append(record)
    if not records:  # a short run may have only valid records (fewer updates than --log-interval)
        raise DataError(f"--log-file {path} is empty; was it written by nmt train --log-file?")
    return RunLog(label or path.stem, records)


def plot_curves(runs: list[RunLog], output: Path) -> dict[tuple[str, str, str, str], tuple[list, list]]:
    """Draw every panel that has data, against updates and wall clock; write `output`. Returns the drawn series:
    (run label, event, field, x) -> (x values, y values)."""
    check_output(output)
    plt = pyplot()
    panels = [
        t for t, fields in PANELS.items() if any(run.series(e, f, "update")[0] for run in runs for e, f in fields)
    ]
    if not panels:
        raise DataError("the --log-file records hold no loss, BLEU, lr or tokens/s to plot")
    fig, axes = plt.subplots(
        len(X_AXES), len(panels), figsize=(4.2 * len(panels), 6.4), squeeze=False, constrained_layout=True
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = {}
    for row, (x, x_label) in enumerate(X_AXES.items()):
        for col, title in enumerate(panels):
            ax = axes[row][col]
            for i, run in enumerate(runs):
                for event, field in PANELS[title]:
                    xs, ys = run.series(event, field, x)
                    if xs:
                        style = "--" if event == "valid" and len(PANELS[title]) > 1 else "-"
                        marker = "o" if event == "valid" else None
                        label = f"{run.label} {event}" if len(PANELS[title]) > 1 else run.label
                        color = colors[i % len(colors)]
                        ax.plot(xs, ys, style, marker=marker, markersize=3, color=color, label=label)
                        drawn[(run.label, event, field, x)] = (xs, ys)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel(x_label, fontsize=8)
            ax.grid(alpha=0.3)
            if title == "loss (label-smoothed)":
                ax.legend(fontsize=7)
    if len(runs) > 1 and panels[-1] != "loss (label-smoothed)":
        axes[0][-1].legend(fontsize=7)
    save_figure(fig, output)
    return drawn
