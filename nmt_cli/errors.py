"""Errors the user can fix. The CLI prints them as one line and exits 1; anything else is a bug.

Also Ctrl-C while the program starts: importing torch, numpy and pybind11 modules, a KeyboardInterrupt is
turned into an ImportError or a C++ abort, or lost, so until the command's work begins SIGINT prints one line and
exits 130 at once (nothing is written before then). This module imports nothing heavy, so it is in place first.
"""

import os
import signal
import threading
from types import FrameType

# The exit status of a program stopped by SIGINT (128 + 2), as shells report it.
INTERRUPTED_STATUS = 128 + signal.SIGINT
INTERRUPTED = "error: interrupted"


def _quit_at_once(signum: int, frame: FrameType | None) -> None:
    os.write(2, f"{INTERRUPTED}\n".encode())
    os._exit(INTERRUPTED_STATUS)


def quit_on_ctrl_c() -> None:
    """From now, Ctrl-C prints `error: interrupted` and exits 130 at once, wherever the program is. Only where SIGINT
    has Python's own handler, on the main thread: an ignored SIGINT (a background job) stays ignored."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is (
        signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _quit_at_once)


def raise_on_ctrl_c() -> None:
    """The command's work begins: Ctrl-C raises KeyboardInterrupt again, so that writers stop cleanly (files.py)
    and train saves its checkpoint."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is _quit_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class NmtError(Exception):
    """Base class for every error caused by user input or the environment."""


class ConfigError(NmtError):
    """An option or configuration value is invalid."""


class DataError(NmtError):
    """Input text or a binarized data directory is missing or malformed."""


class CheckpointError(NmtError):
    """A checkpoint is missing, unreadable, or does not fit."""


class ExportError(NmtError):
    """A checkpoint cannot be exported to the requested format, or the exporter is not installed."""
