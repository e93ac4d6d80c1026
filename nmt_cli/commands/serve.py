"""`nmt serve`: load the checkpoint, listen, and serve until SIGTERM or Ctrl-C.

Starlette and uvicorn are the optional extra `nmt[serve]`, imported here so that their absence is one
error line. On SIGTERM (or SIGINT) uvicorn stops accepting connections and waits for the requests it has
accepted, whose queued sentences the worker finishes; then the command returns (exit status 0).
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError
from nmt_cli.runtime import set_threads

logger = logging.getLogger(__name__)

INSTALL_HINT = 'nmt serve needs starlette and uvicorn; install them with `pip install "nmt[serve]"`'


def require_server_library() -> None:
    missing = [name for name in ("starlette", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"{INSTALL_HINT} ({' and '.join(missing)} missing)")


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that port 0 (any free port) can be logged as the port it got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit TCP_NODELAY: without it a keep-alive client waits for its delayed ACK
    # before the second write of each response (headers, then body) leaves the server.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on --host {host} --port {port}: {e.strerror}") from None
    return sock


@contextmanager
def quiet_exit_signals() -> Iterator[None]:
    """uvicorn re-raises the signal that stopped it once it has shut down; let that one end us with status 0."""
    handled = (signal.SIGTERM, signal.SIGINT)
    before = {sig: signal.signal(sig, lambda signum, frame: None) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def serve(cfg: ServeConfig, search_overrides: dict[str, Any]) -> None:
    """Serve the checkpoint cfg.path over HTTP until a signal stops it."""
    require_server_library()
    import uvicorn

    from nmt_cli.serve.app import Limits, make_app
    from nmt_cli.serve.engine import Engine

    set_threads(cfg.threads)
    engine = Engine(cfg, search_overrides)
    sock = listen(cfg.host, cfg.port)
    app = make_app(engine, cfg.max_wait_ms / 1000, cfg.max_queue, Limits(cfg.max_request_sentences, cfg.timeout))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    host, port = sock.getsockname()[:2]
    logger.info(
        "serving %s (%s) on http://%s:%d (%s, %s, batches of %d tokens, waiting %g ms)",
        cfg.path,
        engine.info["task"],
        f"[{host}]" if ":" in host else host,
        port,
        engine.device,
        engine.precision if cfg.quantize is None else cfg.quantize,
        cfg.max_batch_tokens,
        cfg.max_wait_ms,
    )
    with quiet_exit_signals():
        server.run(sockets=[sock])
    logger.info("stopped: every accepted request was answered")
