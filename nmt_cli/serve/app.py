"""The HTTP side of `nmt serve`: a Starlette app around an Engine and its Batcher.

POST /translate  {"text": "..."} or {"texts": [...]} and optional search fields (beam, nbest, lenpen, ...)
                 -> {"translations": [{"text", "score", "nbest"?, "warning"?}, ...], "seconds"}
GET /health      alive;  GET /ready  loaded and warm (503 until the warm-up sentence is done)
GET /info        languages, model shape, vocabulary, checkpoint, search settings, version
GET /metrics     Prometheus text;  GET /  a page to translate with

Every error is JSON {"error": "..."}: 400 for a request the server cannot read (malformed JSON, invalid
UTF-8, a wrong field or type, no texts, more than --max-request-sentences), 413 for an oversized body,
503 when the queue is full or the server is stopping, 504 past --timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from nmt_cli.errors import NmtError
from nmt_cli.serve.batcher import Batcher, QueueFull, Stopping
from nmt_cli.serve.engine import Engine
from nmt_cli.serve.metrics import Metrics
from nmt_cli.serve.page import PAGE

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20


class RequestError(Exception):
    """A request the server answers with `status` and {"error": message}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Limits:
    max_request_sentences: int
    timeout: float  # seconds


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def read_json(body: bytes) -> Any:
    """The request body as JSON, decoded as strict UTF-8."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"the body has {len(body):,} bytes; the server takes {MAX_BODY_BYTES:,} at most")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the body is not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None


def request_texts(payload: Any, max_sentences: int) -> tuple[list[str], dict[str, Any]]:
    """The texts of a /translate body and its other (search) fields."""
    if not isinstance(payload, dict):
        raise RequestError(400, 'the body must be a JSON object: {"text": "..."} or {"texts": ["...", ...]}')
    fields = dict(payload)
    if ("text" in fields) == ("texts" in fields):
        raise RequestError(400, 'give either "text" (one string) or "texts" (a list of strings)')
    if "text" in fields:
        texts = [fields.pop("text")]
        if not isinstance(texts[0], str):
            raise RequestError(400, f'"text" must be a string, not {type(texts[0]).__name__}')
    else:
        texts = fields.pop("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise RequestError(400, '"texts" must be a list of strings')
        if not texts:
            raise RequestError(400, '"texts" is empty; give at least one string')
    if len(texts) > max_sentences:
        raise RequestError(
            400, f"{len(texts)} texts in one request; the server takes {max_sentences} (--max-request-sentences)"
        )
    return texts, fields


async def client_gone(request: Request) -> None:
    """Returns when the client disconnects (after the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def outcome(future: Future[list[Any]], request: Request, seconds: float, timeout: float) -> list[Any]:
    """The results of a submitted request within `seconds` (what is left of `timeout`); cancels the request (its
    queued sentences are dropped) on 504 or when the client disconnects."""
    waiter: asyncio.Future[Any] = asyncio.wrap_future(future)
    gone: asyncio.Future[Any] = asyncio.ensure_future(client_gone(request))
    try:
        done, _ = await asyncio.wait({waiter, gone}, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if waiter in done:
        return waiter.result()
    future.cancel()
    waiter.cancel()
    if gone in done:
        raise RequestError(499, "the client closed the connection")
    raise RequestError(504, f"the request was not done within --timeout {timeout:g} s")


class Server:
    """The routes, sharing one engine, batcher and set of counters."""

    def __init__(self, engine: Engine, batcher: Batcher, metrics: Metrics, limits: Limits) -> None:
        self.engine, self.batcher, self.metrics, self.limits = engine, batcher, metrics, limits

    async def translate(self, request: Request) -> Response:
        start = time.perf_counter()
        n_sentences = 0
        try:
            texts, fields = request_texts(read_json(await request.body()), self.limits.max_request_sentences)
            n_sentences = len(texts)
            answer = await self.answer(request, texts, fields, start)
        except RequestError as e:
            self.metrics.request(e.status, n_sentences, time.perf_counter() - start)
            return error(e.status, str(e))
        seconds = time.perf_counter() - start
        self.metrics.request(200, n_sentences, seconds)
        return JSONResponse({**answer, "seconds": round(seconds, 4)})

    async def answer(self, request: Request, texts: list[str], fields: dict[str, Any], start: float) -> dict:
        try:
            search = self.engine.search_config(fields)
            sentences = self.engine.prepare(texts)
            future = self.batcher.submit(search, sentences, [self.engine.length(s) for s in sentences])
        except NmtError as e:
            raise RequestError(400, str(e)) from None
        except (QueueFull, Stopping) as e:
            raise RequestError(503, str(e)) from None
        try:
            left = self.limits.timeout - (time.perf_counter() - start)
            results = await outcome(future, request, left, self.limits.timeout)
        except RequestError:
            raise
        except Exception as e:  # the batch failed (logged with its traceback by the worker)
            raise RequestError(500, f"the translation failed: {e}") from None
        translations = []
        for sentence, result in zip(sentences, results):
            warning = self.engine.warning(sentence)
            translations.append({**result, "warning": warning} if warning else result)
        return {"translations": translations}

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready_check(self, request: Request) -> Response:
        ready = self.batcher.ready.is_set()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    async def info(self, request: Request) -> Response:
        return JSONResponse(self.engine.info)

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.batcher.start()
        try:
            yield
        finally:  # uvicorn has answered every request it accepted; the queue is empty or being finished
            await asyncio.get_running_loop().run_in_executor(None, self.batcher.stop)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404, 405) as JSON too."""
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, str(exc.detail))


def build_app(engine: Engine, batcher: Batcher, metrics: Metrics, limits: Limits) -> Starlette:
    server = Server(engine, batcher, metrics, limits)
    routes = [
        Route("/", server.page, methods=["GET"]),
        Route("/translate", server.translate, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/ready", server.ready_check, methods=["GET"]),
        Route("/info", server.info, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=server.lifespan, exception_handlers={HTTPException: http_error})
    app.state.server = server
    return app


def make_app(engine: Engine, max_wait: float, max_queue: int, limits: Limits) -> Starlette:
    """The app with its own batcher and metrics: the one place they are wired together."""
    batcher = engine.batcher(max_wait, max_queue)
    metrics = Metrics(lambda: batcher.queue_length)
    batcher.on_batch = metrics.batch
    return build_app(engine, batcher, metrics, limits)
