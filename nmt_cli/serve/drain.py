"""uvicorn's server with `nmt serve`'s shutdown: a drain bounded by --drain-timeout.

At the first SIGTERM, SIGINT or SIGHUP, /ready answers 503 for `drain_grace` seconds while requests are still
served (a load balancer takes the server out meanwhile); then the server stops accepting connections, closes the
idle ones, and lets the requests already open be answered, until none is left or `drain_timeout` seconds have
passed. At that deadline, or at a second signal, every request still open is answered 503 and its queued sentences
are dropped; connections still open then are closed. (uvicorn's own shutdown waits for every connection without a
bound, and at a second Ctrl-C answers a plain-text 500 with CancelledError tracebacks.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from nmt_cli.serve.app import Server as App

logger = logging.getLogger(__name__)

POLL = 0.05  # seconds between looks at the open requests and connections while draining
ANSWER_GRACE = 5.0  # seconds the aborted requests' 503s may take to be written before their connections close


@dataclass
class Drain:
    """What the shutdown did."""

    signum: int | None = None  # the signal that started it
    cut_short: str = ""  # why the requests still open were answered 503: the deadline, or a second signal
    answered: Counter[int] = field(default_factory=Counter)  # requests answered since the signal, by status
    aborted: int = 0  # of them, those answered 503 because the drain was cut short
    closed: int = 0  # connections closed unanswered (their client stopped sending or reading)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "the shutdown"

    @property
    def clean(self) -> bool:
        """Every request open at the signal got its own answer."""
        return not self.aborted and not self.closed

    def summary(self) -> str:
        """One line: the requests answered during the drain by status, and those cut short."""
        total = sum(self.answered.values())
        statuses = ", ".join(f"{n} x {code}" for code, n in sorted(self.answered.items()))
        said = f"{total} request(s) answered during the drain" + (f" ({statuses})" if total else "")
        if self.aborted:
            said += f"; {self.aborted} of them got 503 as {self.cut_short}"
        if self.closed:
            said += f"; {self.closed} connection(s) closed without an answer (a client still sending or not reading)"
        return f"stopped after {self.signal_name}: {said}"


class Loading:
    """The ASGI app the server listens with from the start: while the models load and warm up, /health answers 200,
    /ready 503 and any other request 503 with Retry-After; then `app`, once set, answers everything."""

    def __init__(self) -> None:
        self.app: Starlette | None = None
        self.error: BaseException | None = None  # what loading failed on

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            health, ready = scope["path"] == "/health", scope["path"] == "/ready"
            body = (
                {"status": "loading"} if health else {"ready": False} if ready else {"error": "the models are loading"}
            )
            await JSONResponse(body, 200 if health else 503, {"Retry-After": "1"})(scope, receive, send)

    def load(self, open_app: Callable[[], Starlette], server: uvicorn.Server) -> None:
        """Open the app (on a thread of its own); a failure stops the server, and `error` says what it was."""
        try:
            self.app = open_app()
        except BaseException as e:
            self.error, server.should_exit = e, True


class DrainingServer(uvicorn.Server):
    """A uvicorn Server whose shutdown drains the app's open requests within `drain_timeout` seconds."""

    def __init__(self, config: uvicorn.Config, loading: Loading, drain_timeout: float, drain_grace: float) -> None:
        super().__init__(config)
        self.loading, self.drain_timeout, self.drain_grace = loading, drain_timeout, drain_grace
        self.drain = Drain()

    @property
    def app(self) -> App:
        assert self.loading.app is not None
        return self.loading.app.state.server

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT and SIGTERM, and SIGHUP alike (a closed terminal, a service manager's stop): each drains,
        where SIGHUP's default would end the process at once, its open requests unanswered."""
        main = threading.current_thread() is threading.main_thread()  # signals are the main thread's alone
        before = signal.signal(signal.SIGHUP, self.handle_exit) if main else None
        try:
            with super().capture_signals():
                yield
        finally:
            if before is not None:
                signal.signal(signal.SIGHUP, before)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first signal starts the drain, a second cuts it short (not recorded to be raised again, as uvicorn's)."""
        if self.drain.signum is None:
            self.drain.signum = sig
            self.should_exit = True
        else:
            self.force_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.loading.app is None:  # stopped while the models load: nothing was taken
            for server in self.servers:
                server.close()
            return
        if self.drain_grace:  # a second signal ends it
            self.app.unready = True
            logger.info("%s: /ready answers 503 for --drain-grace %g s", self.drain.signal_name, self.drain_grace)
            end = time.monotonic() + self.drain_grace
            while not self.force_exit and time.monotonic() < end:
                await asyncio.sleep(POLL)
        started = time.monotonic()
        for server in self.servers:  # stop accepting
            server.close()
        for sock in sockets or []:
            sock.close()
        self.app.drain()
        for connection in list(self.server_state.connections):  # idle ones close now, busy ones after their answer
            connection.shutdown()
        if self.app.open_requests:
            logger.info(
                "%s: answering the %d open request(s), for --drain-timeout %g s at most (a second signal: 503 now)",
                self.drain.signal_name,
                self.app.open_requests,
                self.drain_timeout,
            )
        while self._open() and not self.force_exit and time.monotonic() - started < self.drain_timeout:
            await asyncio.sleep(POLL)
        if self.app.open_requests:
            waited = time.monotonic() - started
            self.drain.cut_short = (
                f"a second signal came {waited:.1f} s into the drain"
                if self.force_exit
                else f"--drain-timeout {self.drain_timeout:g} s passed"
            )
            # the worker's batch in progress is not waited for: its requests have their 503s
            self.app.abort(f"the server is shutting down: {self.drain.cut_short}", stop_wait=0)
            grace = time.monotonic() + ANSWER_GRACE
            while self._open() and time.monotonic() < grace:
                await asyncio.sleep(POLL)
        for connection in list(self.server_state.connections):  # a client that stopped sending, or reading
            transport = getattr(connection, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()
                self.drain.closed += 1
        self.drain.answered, self.drain.aborted = Counter(self.app.answered_in_drain), self.app.aborted_requests
        # the worker ends: every queued sentence was answered or dropped
        await asyncio.get_running_loop().run_in_executor(None, self.app.batcher.stop, self.app.stop_wait)

    def _open(self) -> bool:
        return bool(self.app.open_requests or self.server_state.connections)
