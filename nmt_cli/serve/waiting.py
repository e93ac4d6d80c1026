"""What an open /translate request waits for, each wait bounded: its body (within --max-body-bytes and --timeout),
then its results (within what is left of --timeout), either cut short when its client goes away or when the
server's drain is (`Abort`: every open request is answered 503 at once)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect, Request

from nmt_cli.serve.body import RequestError

RETRY_AFTER = {"Retry-After": "1"}  # seconds: a full queue empties within a batch or two


class Aborted(RequestError):
    """An open request answered 503 because the server's drain was cut short."""

    def __init__(self, reason: str) -> None:
        super().__init__(503, reason, RETRY_AFTER)


@dataclass
class Abort:
    """Set (with its reason) when the drain is cut short: every open request is answered 503 at once."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""


async def client_gone(request: Request) -> None:
    """Returns when the client disconnects (after the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def first_of(work: asyncio.Future[Any], *others: asyncio.Future[Any], timeout: float | None = None) -> set:
    """Wait for `work` or any of `others` (at most `timeout` s); those done. The others are cancelled on return,
    and `work` too when the wait itself is cancelled."""
    try:
        done, _ = await asyncio.wait({work, *others}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        raise
    finally:
        for other in others:
            other.cancel()
    return done


async def body_of(request: Request, *, max_bytes: int, timeout: float, abort: Abort) -> bytes:
    """The request's body, unless the client goes away first (499), the server aborts (503), or `timeout` passes
    first (408: a client that sends part of its body and stops holds its connection no longer)."""
    reading = asyncio.ensure_future(read_body(request, max_bytes))
    done = await first_of(reading, asyncio.ensure_future(abort.event.wait()), timeout=timeout)
    if reading not in done:
        reading.cancel()
        if not abort.event.is_set():
            raise RequestError(408, f"the body did not arrive within --timeout {timeout:g} s")
        raise Aborted(abort.reason)
    try:
        return reading.result()
    except ClientDisconnect:
        raise RequestError(499, "the client closed the connection before sending its whole body") from None


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) from its Content-Length before it is read, or where the stream passes `limit`
    (--max-body-bytes): no more than that is ever held."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise RequestError(413, f"the body has {declared} bytes; the server takes {limit:,} at most (--max-body-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"the body passes {limit:,} bytes, the most the server takes (--max-body-bytes)")
    return bytes(body)


async def outcome(
    future: Future[list[Any]], request: Request, *, seconds: float, timeout: float, abort: Abort
) -> list[Any]:
    """The results of a submitted request within `seconds` (what is left of `timeout`, --timeout); cancels the
    request (its queued sentences are dropped) on 504, when the client disconnects, or when the server aborts."""
    waiter: asyncio.Future[Any] = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(client_gone(request))
    aborted = asyncio.ensure_future(abort.event.wait())
    try:
        done = await first_of(waiter, gone, aborted, timeout=max(seconds, 0))
    except BaseException:
        future.cancel()
        raise
    if waiter in done:
        return waiter.result()
    future.cancel()
    waiter.cancel()
    if gone in done:
        raise RequestError(499, "the client closed the connection")
    if aborted in done:
        raise Aborted(abort.reason)
    raise RequestError(504, f"the request was not done within --timeout {timeout:g} s")
