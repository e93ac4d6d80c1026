"""`nmt serve`: listen, load the checkpoints and warm the models up, and serve until SIGTERM or Ctrl-C.

Starlette and uvicorn are the optional extra `nmt[serve]`, imported here so that their absence is one error line.
Options that cannot work are one error line (exit 1): those checked before the server listens, and whatever loading
or the warm-up translation fails on while it listens already (/health 200, /ready 503: serve/drain.py's Loading).
On SIGTERM (or SIGINT) the server drains (serve/drain.py); the log's last line says what was answered. Exit status 0
when every open request got its own answer, 128 + the signal with one error line when some got 503.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError, NmtError
from nmt_cli.log import log_json_lines, print_error
from nmt_cli.runtime import set_threads, usable_cores
from nmt_cli.serve.keys import Keys
from nmt_cli.signals import Interrupted

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from nmt_cli.serve.app import Limits
    from nmt_cli.serve.batcher import Batcher

logger = logging.getLogger(__name__)

SERVER_LIBRARIES = ("starlette", "uvicorn", "sentencex", "py3langid")  # the extra nmt[serve]
INSTALL_HINT = f'nmt serve needs {", ".join(SERVER_LIBRARIES)}; install them with `pip install "nmt[serve]"`'


def require_server_library() -> None:
    missing = [name for name in SERVER_LIBRARIES if importlib.util.find_spec(name) is None]
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
    """Signals after the server has returned (while the command reports) are ignored: the drain is over."""
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {sig: signal.signal(sig, lambda signum, frame: None) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def serve(cfg: ServeConfig, search_overrides: dict[str, Any]) -> None:
    """Serve the checkpoints cfg.path and cfg.more_paths over HTTP until a signal stops it."""
    require_server_library()
    import uvicorn

    from nmt_cli.serve.app import Limits
    from nmt_cli.serve.drain import DrainingServer, Loading
    from nmt_cli.serve.limits import RateLimit

    if cfg.log_format == "json":
        log_json_lines()
    key, key_source = api_key(cfg)  # refused before the model is loaded
    origins = cors_origins(cfg.cors_origin)
    limits = Limits(cfg.max_request_sentences, cfg.timeout, cfg.max_body_bytes, key, origins, cfg.max_client_sentences)
    metrics = secret(cfg.metrics_token, cfg.metrics_token_file, option="--metrics-token", what="the metrics token")
    limits.metrics_token = metrics[0]
    limits.rate = RateLimit(cfg.req_limit, cfg.char_limit_per_minute, cfg.req_limit_daily)
    threads_note = set_serving_threads(cfg.threads)
    sock = listen(cfg.host, cfg.port)  # bound (a port in use is refused now), listening once the server runs
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    loading = Loading()  # listens from now on: /health 200, /ready 503 until the models are loaded and warm
    # None: uvicorn's own default, $FORWARDED_ALLOW_IPS else the loopback addresses
    config = uvicorn.Config(
        loading, log_level="warning", access_log=False, lifespan="off", forwarded_allow_ips=cfg.forwarded_allow_ips
    )
    server = DrainingServer(config, loading, cfg.drain_timeout, cfg.drain_grace)
    logger.info("listening at %s while the models load; %s", url, threads_note)
    if key_source:
        logger.info("clients must send `Authorization: Bearer KEY` (the key from %s)", key_source)
    elif not ipaddress.ip_address(host).is_loopback:
        logger.warning(
            "no API key on %s: anyone who reaches this port may translate with it; give --api-key-file or "
            "NMT_API_KEY, or put a proxy that authenticates in front (docs/guide.md)",
            host,
        )
    opening = threading.Thread(target=loading.load, args=(lambda: open_app(cfg, search_overrides, limits, url), server))
    opening.start()
    with quiet_exit_signals():
        server.run(sockets=[sock])
        if loading.error is not None:
            raise loading.error  # an option that could not work (one error line), or a bug
        if loading.app is None:  # the models were still loading (the worker not yet started)
            exit_now(Interrupted("stopped while the models loaded", server.drain.signum or signal.SIGTERM))
        drain = server.drain
        logger.info("%s", drain.summary())
    if drain.clean:
        return
    stopped = Interrupted(
        f"{drain.aborted + drain.closed} request(s) open at {drain.signal_name} were not answered with their "
        f"translations ({drain.cut_short or 'their connections were closed'})",
        drain.signum or signal.SIGTERM,
    )
    if loading.app.state.server.batcher.running:  # mid-batch: exiting would abort in the worker's torch call
        exit_now(stopped)
    raise stopped


def open_app(cfg: ServeConfig, search_overrides: dict[str, Any], limits: Limits, url: str) -> Starlette:
    """The app serving the checkpoints, opened and warmed up (on a thread of its own, while the server listens)."""
    from nmt_cli.serve.app import make_app
    from nmt_cli.serve.models import Models

    models = Models.open(cfg, search_overrides)
    served = models.default.served
    app = make_app(models, cfg.max_wait_ms / 1000, cfg.max_queue, limits)
    warm_up(app.state.server.batcher)
    logger.info(
        "serving %s on %s (%s, %s, batches of %d tokens, waiting %g ms)",
        ", ".join(
            f"{m.spec} ({m.served.info['task']})" if len(models) == 1 else f"{m.name}: {m.served.path}" for m in models
        ),
        url,
        served.device,
        served.precision if cfg.quantize is None else cfg.quantize,
        cfg.max_batch_tokens,
        cfg.max_wait_ms,
    )
    return app


def serving_threads(n_threads: int) -> int:
    """--threads as given, or for 0 every core this process may use (its CPU affinity: a container's or taskset's
    cores, at most its cgroup's CPU quota, which torch's own default does not read). With 32 clients on the same 2
    cores, 2 threads answered more sentences per second than 1 (benchmarks/record/serve.md); fewer help only where
    other processes load the cores, so that the search's threads wait on one another."""
    return n_threads or usable_cores()


def set_serving_threads(n_threads: int) -> str:
    """Set the search's intra-op threads (`serving_threads`); how many, for the log line `serve` writes once the
    model is loaded (a start refused on the options stays one error line)."""
    threads = serving_threads(n_threads)
    set_threads(threads)
    how = "--threads" if n_threads else f"--threads 0: the {usable_cores()} core(s) this process may use"
    return f"searching with {threads} CPU thread(s) ({how})"


API_KEY_ENV = "NMT_API_KEY"
HEADER_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: what a Bearer header carries whole
ORIGIN = re.compile(r"https?://[^/\s]+")  # an Origin header: scheme, host and port, no path


def api_key(cfg: ServeConfig) -> tuple[str | Keys | None, str]:
    """The API key clients must send (None: none; Keys: --api-key-file's, a key a line), from --api-key, --api-key-file
    or NMT_API_KEY in that order, and where it came from, for the log (never the key itself)."""
    if cfg.api_key_file is not None and cfg.api_key is None:
        return Keys(path=cfg.api_key_file), f"--api-key-file {cfg.api_key_file}"
    return secret(cfg.api_key, cfg.api_key_file, option="--api-key", what="the API key", env=API_KEY_ENV)


def secret(given: str | None, path: str | None, *, option: str, what: str, env: str = "") -> tuple[str | None, str]:
    """A Bearer token from `option`, the first line of the file of `option`-file, else the variable `env`: the
    token (None: none) and where it came from, for the log (never the token itself)."""
    if given is not None and path is not None:
        raise ConfigError(f"give {what} once: {option} or {option}-file, not both")
    if given is not None:
        key, source = given, option
    elif path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                key, source = f.readline().strip(), f"{option}-file {path}"
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{option}-file {path}: cannot read {what}: {e}") from None
    elif env in os.environ:
        key, source = os.environ[env], env
    else:
        return None, ""
    if not HEADER_TOKEN.fullmatch(key):
        raise ConfigError(
            f"{what} from {source} must be printable ASCII without spaces (it is sent in an HTTP header)"
            + (", and not empty" if not key else "")
        )
    return key, source


def cors_origins(text: str | None) -> tuple[str, ...]:
    """--cors-origin's comma-separated origins, each as a browser sends it (https://host[:port]) or *."""
    origins = tuple(o.strip().rstrip("/") for o in (text or "").split(",") if o.strip())
    for origin in origins:
        if origin != "*" and not ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"--cors-origin {origin!r} is not an origin: give scheme://host[:port] (https://example.org), or *"
            )
    return origins


def exit_now(stopped: Interrupted) -> NoReturn:
    """Say why and exit at once, leaving the worker's batch unfinished: at the interpreter's exit a daemon thread
    inside a torch call is unwound, and the process aborted ("terminate called without an active exception")."""
    print_error(str(stopped))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(stopped.exit_code)


def warm_up(batcher: Batcher) -> None:
    """Start the worker and wait for its warm-up translation (on the loading thread: a signal stops the server, which
    exits without waiting); what it failed on is one error line."""
    batcher.start()
    batcher.warmed.wait()
    error = batcher.warm_up_error
    if error is None:
        return
    batcher.stop(5)  # the worker is idle: it ends at once
    if isinstance(error, NmtError):
        raise error
    raise ConfigError(
        f"the model failed to translate a warm-up sentence with these options: {type(error).__name__}: {error}"
    ) from error
