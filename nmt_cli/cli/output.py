"""Standard output, written one way by every command (click.echo, print, `--help`): through `GuardedStdout`.

A stdout that cannot take the output (closed with `>&-`, a full disk, a read-only descriptor) is one `error:` line
and exit 1, never a traceback nor a silent success; a reader that has gone (`nmt generate ... | head`) raises
BrokenPipeError, which the CLI turns into a quiet stop.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO, cast

from nmt_cli.errors import NmtError


class StdoutError(NmtError):
    """Standard output is closed or cannot be written."""


CLOSED = "standard output is closed; redirect it to a file (> FILE) or discard it (> /dev/null)"


class GuardedStdout:
    """sys.stdout for the command: writes and flushes go to the real stream, and any failure but a gone reader
    is a StdoutError. What stays buffered after a failure is sent to /dev/null, so that Python's own flush at
    exit adds no second error. No `buffer` attribute: click writes its text through this object too."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.error: StdoutError | None = None if stream is not None else StdoutError(CLOSED)

    @property
    def encoding(self) -> str:
        return self.stream.encoding if self.stream is not None else "utf-8"

    @property
    def errors(self) -> str | None:
        return self.stream.errors if self.stream is not None else "strict"

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click probes for a binary stream with write(b"")
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self.error is not None:
            raise self.error
        assert self.stream is not None
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise self.failed(e) from None

    def flush(self) -> None:
        if self.error is not None or self.stream is None:
            return  # reported already (or nothing was written): Python's flush at exit stays quiet
        try:
            self.stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as e:
            raise self.failed(e) from None

    def failed(self, e: OSError | ValueError) -> StdoutError:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        self.error = StdoutError(f"cannot write to standard output: {reason}")
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, cast(TextIO, self.stream).fileno())
            os.close(devnull)
        return self.error

    def isatty(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    def fileno(self) -> int:
        if self.stream is None:
            raise OSError(9, "standard output is closed")
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


def guard_stdout() -> None:
    """Put GuardedStdout in place of sys.stdout. When stdout was closed (Python then sets it to None), its
    descriptor 1 is taken by /dev/null first, so that no file the command opens lands on it."""
    if sys.stdout is None:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    sys.stdout = cast(TextIO, GuardedStdout(sys.stdout))


def finish_stdout() -> None:
    """Flush what the command printed (a failure is a StdoutError) before the interpreter's own flush at exit."""
    sys.stdout.flush()
