"""Logging and progress bars on stderr; the only module that imports rich."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

console = Console(stderr=True)
_progress_enabled = True


def setup_logging(quiet: bool = False, progress: bool = True) -> None:
    """One handler on stderr: rich on a terminal, plain unwrapped lines otherwise (files, pipes, CI).

    Info and up, or warnings and errors only when quiet.
    """
    global _progress_enabled
    _progress_enabled = progress
    level = logging.WARNING if quiet else logging.INFO
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(
            console=console, show_path=False, show_time=True, markup=False, log_time_format="[%Y-%m-%d %X]"
        )
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("nmt_cli")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class JsonLines(logging.Formatter):
    """A record as one line of JSON: its time (ISO 8601, with the date and the local zone), level, logger and
    message, and the fields it carries as `extra={"fields": {...}}` (the access log's)."""

    def format(self, record: logging.LogRecord) -> str:
        time = datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")
        line = {"time": time, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line | getattr(record, "fields", {}))


def log_json_lines() -> None:
    """Every record from now on as a line of JSON on stderr (`serve --log-format json`), for a log collector."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.getLogger("nmt_cli").handlers[:] = [handler]


def print_error(message: str) -> None:
    # escape: a message quoting brackets (`pip install "nmt[plot]"`, a path) is text, not markup
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)


def print_table(title: str, rows: Mapping[str, Any]) -> None:
    if not console.is_terminal:
        logging.getLogger("nmt_cli").info("%s: %s", title, ", ".join(f"{k}={v}" for k, v in rows.items()))
        return
    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in rows.items():
        table.add_row(str(key), str(value))
    console.print(table)


class _NoProgress:
    def add_task(self, *args: Any, **kwargs: Any) -> TaskID:
        return TaskID(0)

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass

    def advance(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextmanager
def progress() -> Iterator[Progress | _NoProgress]:
    """A transient progress bar on stderr; a no-op when stderr is not a terminal or bars are off."""
    if not (_progress_enabled and console.is_terminal):
        yield _NoProgress()
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=True,
    )
    with bar:
        yield bar
