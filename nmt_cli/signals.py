"""SIGINT and SIGTERM: a clean stop of a block (`stop_on_signals`, for writers), or signals recorded and acted on
later (`deferred_signals`, for training, which saves before it stops).

A stopped block raises `Interrupted`, which the CLI turns into one line and exit 128 + the signal. Handlers are set
on the main thread only (Python allows no other); elsewhere both context managers change nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped a write or an abandonable pass; exits 128 + the signal. A BaseException, as
    KeyboardInterrupt is, so that code catching Exception (logging's handlers) does not swallow it."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def causes(error: BaseException) -> Iterator[BaseException]:
    """`error` and the exceptions it was raised from or while handling (torch chains several)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def interruption(error: BaseException) -> Interrupted | None:
    """The Interrupted a signal raised, when `error` is it or came from it (torch.save raises its own on top)."""
    return next((e for e in causes(error) if isinstance(e, Interrupted)), None)


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def stop_on_signals(message: str) -> Iterator[None]:
    """In the block, SIGINT and SIGTERM raise Interrupted("stopped by SIGNAL; `message`") so that the writer's
    clean-up runs; a second signal during it is ignored. Signals already handled or ignored are left alone."""
    if not on_main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    ours = [s for s, h in previous.items() if h in (signal.default_int_handler, signal.SIG_DFL)]
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        if not received:
            received.append(signum)
            raise Interrupted(f"stopped by {signal_name(signum)}; {message}", signum)

    for s in ours:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s in ours:
            signal.signal(s, previous[s])


class Deferred:
    """The stop signal `deferred_signals` recorded (`received`, 0 until one came), and what a further one is told:
    `waiting`, one line on stderr (nothing when empty)."""

    def __init__(self, waiting: str) -> None:
        self.received = 0
        self.waiting = waiting
        self.abandoning = False

    @contextmanager
    def abandonable(self) -> Iterator[None]:
        """In the block the stop signal raises Interrupted at once (on entry, when one came before): for work done
        again later anyway (a validation pass)."""
        if self.received:
            raise Interrupted(f"stopped by {signal_name(self.received)}", self.received)
        self.abandoning = True
        try:
            yield
        finally:
            self.abandoning = False


@contextmanager
def deferred_signals(waiting: str) -> Iterator[Deferred]:
    """In the block, SIGINT and SIGTERM raise nothing (but in `Deferred.abandonable`): the first is recorded for the
    block to act on, every further one prints "SIGNAL ignored: `waiting`" (when not empty) so that a save finishes.
    The line goes to stderr's descriptor at once: a handler must not enter stderr's buffer or logging's locks.
    """
    deferred = Deferred(waiting)
    if not on_main_thread():
        yield deferred
        return

    def record(signum: int, frame: Any) -> None:
        if not deferred.received:
            deferred.received = signum
            if deferred.abandoning:
                raise Interrupted(f"stopped by {signal_name(signum)}", signum)
        elif deferred.waiting:
            with suppress(OSError):  # no stderr (closed): the signal is still ignored
                os.write(2, f"{signal_name(signum)} ignored: {deferred.waiting}\n".encode())

    previous = {s: signal.signal(s, record) for s in STOP_SIGNALS}
    try:
        yield deferred
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
