"""Who may call `nmt serve` and what is recorded of each call: the API key check, browsers' cross-origin access
(CORS), and the access log with its request ids.

The key is compared in constant time and never logged. Every field of a log line that a client sets (the path,
percent-decoded; the method; a forwarded address) is `printable`: no client can write a line break, a terminal's
escape or a NUL into the log, nor a space that would shift the line's fields.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmt_cli.serve.keys import Key, Keys

access_log = logging.getLogger("nmt_cli.serve.access")

REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII: safe in a log line and a header
PROBES = ("/health", "/ready", "/metrics")  # polled by monitors: logged only when they fail


def printable(text: str) -> str:
    """`text` as one field of a log line: a space, a backslash and every character that str.isprintable() refuses
    (controls, format marks, line separators) escaped as Python writes them (\\x0a, \\u202e, \\\\)."""
    return "".join(
        c if c.isprintable() and c not in " \\" else repr(c)[1:-1] if c > " " else f"\\x{ord(c):02x}" for c in text
    )


def authorized(header: str | None, key: str | Keys | None) -> bool:
    """Whether an Authorization header carries the key, or one of the keys, as `Bearer KEY` (always, when the server
    has none)."""
    return key is None or bearer_key(header, key) is not None


def bearer_key(header: str | None, key: str | Keys) -> Key | None:
    """The key of `key` (one, or Keys) that an Authorization header carries as `Bearer KEY`; None: none of them."""
    scheme, _, given = (header or "").partition(" ")
    return (Keys(key) if isinstance(key, str) else key).match(given.strip()) if scheme.lower() == "bearer" else None


def cors(origins: tuple[str, ...]) -> list[Middleware]:
    """Browsers on these origins may call the API: preflight answered, Access-Control-Allow-Origin for them only."""
    if not origins:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After"],
            max_age=600,
        )
    ]


def request_id(scope: Scope) -> str:
    """The client's (or its proxy's) X-Request-ID when it is printable ASCII of 128 characters at most, else a new
    one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            given = value.decode("latin-1")
            if REQUEST_ID.fullmatch(given):
                return given
    return uuid.uuid4().hex


class AccessLog:
    """ASGI middleware: the request's id (scope["state"]["request_id"], echoed as X-Request-ID) and one log line
    per request (client, method, path, status, sentences for /translate, milliseconds, id); probes are logged only
    when they fail (/ready's 503 before the warm-up is done is not a failure)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        state = scope.setdefault("state", {})
        state["request_id"] = rid = request_id(scope)
        status = 500  # unless a response starts: the app failed before answering

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope["path"]
            if path not in PROBES or (status >= 400 and (path, status) != ("/ready", 503)):  # 503: not warm yet
                client, method, where = scope.get("client"), printable(scope["method"]), printable(path)
                sentences, ms = state.get("sentences"), (time.perf_counter() - start) * 1000
                who = printable(client[0]) if client else "-"
                fields = {"request_id": rid, "client": who, "key_id": state.get("key_id"), "model": state.get("model")}
                fields |= {"method": method, "path": where, "status": status, "sentences": sentences}
                fields |= {"tokens": state.get("tokens"), "latency_ms": round(ms, 1)}  # for --log-format json
                said = "" if sentences is None else f"{sentences} sentences "
                line = (who, method, where, status, said, ms, rid)
                access_log.info("%s %s %s %d %s%.1f ms id=%s", *line, extra={"fields": fields})
