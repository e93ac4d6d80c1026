"""The HTTP side of `nmt serve`: a Starlette app around the served models (Models, models.py) and their Batcher.

POST /translate  {"text": "..."} or {"texts": [...]}, optional "model" (a name; default: the first --path) and
                 search fields (beam, nbest, lenpen, ...)
                 -> {"translations": [{"text", "score", "alignment"?, "nbest"?, "warning"?}, ...], "seconds"}
GET /health      alive;  GET /ready  loaded and warm (503 until every model's warm-up sentence is done)
GET /info        the default model's languages, shape, vocabulary, checkpoint, search settings, version, and
                 "models" (each one's name, languages, task, checkpoint); ?model=NAME: that model's own
GET /metrics     Prometheus text;  GET /  a page to translate with;  GET /openapi.json  this API (openapi.py)
LibreTranslate's /translate body ("q", api_key in place of the header) and GET /languages: libretranslate.py

Every error is JSON {"error": "...", "request_id": "..."}: 400 for a request the server cannot read (malformed
JSON, nested too deeply, invalid UTF-8, a wrong field or type, no texts, more than --max-request-sentences), 401
without the API key (when the server has one: /translate, /info and /metrics need `Authorization: Bearer KEY`;
the others stay open), 413 for a body over --max-body-bytes (refused from its Content-Length before
it is read, or cut off where a chunked body passes it), 429 with Retry-After when the client (its address) has
--max-client-sentences queued or in progress, 503 with Retry-After when the queue is full or the server
is shutting down, 504 past --timeout, 500 for a failure of the server's own (its traceback is logged). A client
that closes its connection before its answer is counted under 499 in /metrics.

Every response carries X-Request-ID: the request's own when it is printable ASCII of 128 characters at most,
else a new one; every request but a successful probe (/health, /ready, /metrics) gets an access log line. A large
body is parsed and its texts encoded on a thread, so that the event loop (and /health) is not held up by them.
With --cors-origin, browsers on those origins may call the API (preflight answered); none by default.

At shutdown (`drain`, `abort`: commands/serve.py's server calls them) the requests already open go on; `abort`
answers those still open with 503 at once and cancels their queued sentences.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from nmt_cli.errors import NmtError
from nmt_cli.serve import libretranslate
from nmt_cli.serve.access import AccessLog, authorized, cors
from nmt_cli.serve.batcher import Batcher
from nmt_cli.serve.body import RequestError, json_kind, read_json, request_constraints, request_prefixes
from nmt_cli.serve.clients import ClientBusy, ClientLoad
from nmt_cli.serve.metrics import Metrics
from nmt_cli.serve.models import Models, key_of, model_of
from nmt_cli.serve.openapi import openapi_json
from nmt_cli.serve.page import PAGE
from nmt_cli.serve.queued import QueueFull, Stopping
from nmt_cli.serve.served_model import Sentence, ServedModel

logger = logging.getLogger(__name__)

OFFLOAD_BYTES = 64 << 10  # a body longer than this is parsed and encoded on a thread, off the event loop
RETRY_AFTER = {"Retry-After": "1"}  # seconds: a full queue empties within a batch or two
KEY_NEEDED = "this server needs its API key: send `Authorization: Bearer KEY` (or LibreTranslate's api_key field)"


class Aborted(RequestError):
    """An open request answered 503 because the server's drain was cut short."""

    def __init__(self, reason: str) -> None:
        super().__init__(503, reason, RETRY_AFTER)


@dataclass
class Limits:
    max_request_sentences: int
    timeout: float  # seconds
    max_body_bytes: int = 8 << 20
    api_key: str | None = None  # None: no key asked
    cors_origins: tuple[str, ...] = ()
    max_client_sentences: int | None = None  # None: no limit per client


def error(status: int, message: str, request: Request | None = None, headers: dict[str, str] | None = None) -> Response:
    body = {"error": message}
    if request is not None and "request_id" in request.scope.get("state", {}):
        body["request_id"] = request.scope["state"]["request_id"]
    return JSONResponse(body, status_code=status, headers=headers)


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
            raise RequestError(400, f'"text" must be a string, not {json_kind(texts[0])}')
    else:
        texts = fields.pop("texts")
        if not isinstance(texts, list):
            raise RequestError(400, f'"texts" must be a list of strings, not {json_kind(texts)}')
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise RequestError(400, f'"texts" must be a list of strings; "texts"[{i}] is {json_kind(text)}')
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


class Server:
    """The routes, sharing the served models, their batcher and one set of counters."""

    def __init__(self, models: Models, batcher: Batcher, metrics: Metrics, limits: Limits) -> None:
        self.models, self.batcher, self.metrics, self.limits = models, batcher, metrics, limits
        self.clients = ClientLoad(limits.max_client_sentences)
        self.open_requests = 0  # /translate requests not yet answered
        self.draining = False  # set by `drain`: the server is shutting down
        self.answered_in_drain: Counter[int] = Counter()  # the status of each request answered since
        self.aborted_requests = 0  # of them, those answered 503 by `abort`
        self.aborted = asyncio.Event()  # set by `abort`: every open request is answered 503 at once
        self.abort_reason = ""
        self.stop_wait: float | None = None  # how long the lifespan's end waits for the worker (None: as it takes)

    @property
    def served(self) -> ServedModel:
        """The default model (the first --path)."""
        return self.models.default.served

    def drain(self) -> None:
        """The server is shutting down: queued sentences wait no more for company, and the answers of the requests
        still open are counted from now on."""
        self.draining = True
        self.batcher.hurry()

    def abort(self, reason: str, stop_wait: float) -> None:
        """Answer every open request 503 `reason` now, dropping its queued sentences; at the lifespan's end, wait
        `stop_wait` s at most for the worker's batch in progress."""
        self.abort_reason, self.stop_wait = reason, stop_wait
        self.aborted.set()

    async def translate(self, request: Request) -> Response:
        start = time.perf_counter()
        n_sentences = request.state.sentences = 0  # for the access log: 0 until the body is read
        model = None  # the model the request asks for, once its body is read
        self.open_requests += 1
        try:
            body, h = await self.body(request), request.headers
            # A large body's JSON and sentencepiece encoding take long enough to stall every other request
            parsed = await run_in_threadpool(self.parse, body, h) if len(body) > OFFLOAD_BYTES else self.parse(body, h)
            n_sentences = request.state.sentences = len(parsed[0])
            model = model_of(parsed[1])
            answer = await self.answer(request, *parsed[:3], start)
        except RequestError as e:
            self.answered(e.status, n_sentences, time.perf_counter() - start, model)
            self.aborted_requests += isinstance(e, Aborted)
            return error(e.status, str(e), request, e.headers)
        finally:
            self.open_requests -= 1
        seconds = time.perf_counter() - start
        try:
            response = JSONResponse(libretranslate.shaped(parsed[3], answer, seconds))
        except ValueError as e:  # a score of inf or NaN (search settings at their extremes), which JSON lacks
            self.answered(500, n_sentences, seconds, model)
            return error(500, f"the translation cannot be written as JSON: {e}", request)
        self.answered(200, n_sentences, seconds, model)
        return response

    def check_key(self, request: Request) -> None:
        """401 unless the server has no API key or the request carries it."""
        if not authorized(request.headers.get("authorization"), self.limits.api_key):
            raise RequestError(401, KEY_NEEDED, {"WWW-Authenticate": "Bearer"})

    def parse(self, body: bytes, headers: Mapping[str, str] | None = None) -> libretranslate.Parsed:
        """A /translate body read, ours or LibreTranslate's: texts encoded, search settings, lengths, LibreRequest."""
        try:
            payload, keyed = libretranslate.read(body, headers, self.limits.api_key, read_json)
            if not keyed:  # neither the header nor LibreTranslate's body carries the key
                raise RequestError(401, KEY_NEEDED, {"WWW-Authenticate": "Bearer"})
            if libretranslate.form_kind(headers, body) and not libretranslate.is_libretranslate(payload):
                raise RequestError(400, 'the form has no "q": give the text to translate as "q" (LibreTranslate\'s)')
            model = self.models.choose(payload)  # which takes our "model" field out of the payload
            one = isinstance(payload, dict) and "text" in payload
            payload, libre = libretranslate.translate_body(payload, model.served.info)
            texts, fields = request_texts(payload, self.limits.max_request_sentences)
            n = len(texts)
            # errors name a text by the request's own field for it: "text" (ours, of one), "q", "q[J] (line L)"
            names = [libre.field_of(i) for i in range(n)] if libre else ["text"] if one else None
            search, sentences = model.served.read_request(
                texts, fields, request_constraints(payload, n), request_prefixes(payload, n), names
            )
        except NmtError as e:
            raise RequestError(400, str(e)) from None
        return sentences, key_of(model, search), [model.served.length(s) for s in sentences], libre

    def answered(self, status: int, sentences: int, seconds: float, model: str | None) -> None:
        self.metrics.request(status, sentences, seconds, model)
        if self.draining:
            self.answered_in_drain[status] += 1

    async def body(self, request: Request) -> bytes:
        """The request's body, unless the client goes away first (499), the server aborts (503), or --timeout passes
        first (408: a client that sends part of its body and stops holds its connection no longer)."""
        reading = asyncio.ensure_future(self.read_body(request))
        done = await first_of(reading, asyncio.ensure_future(self.aborted.wait()), timeout=self.limits.timeout)
        if reading not in done:
            reading.cancel()
            if not self.aborted.is_set():
                raise RequestError(408, f"the body did not arrive within --timeout {self.limits.timeout:g} s")
            raise Aborted(self.abort_reason)
        try:
            return reading.result()
        except ClientDisconnect:
            raise RequestError(499, "the client closed the connection before sending its whole body") from None

    async def read_body(self, request: Request) -> bytes:
        """The body, refused (413) from its Content-Length before it is read, or where the stream passes
        --max-body-bytes: no more than that is ever held."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            raise RequestError(
                413, f"the body has {declared} bytes; the server takes {limit:,} at most (--max-body-bytes)"
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(
                    413, f"the body passes {limit:,} bytes, the most the server takes (--max-body-bytes)"
                )
        return bytes(body)

    async def answer(
        self, request: Request, sentences: list[Sentence], key: tuple[str, Any], lengths: list[int], start: float
    ) -> dict:
        client = request.client.host if request.client else "unknown"
        try:
            self.clients.check(client, len(sentences))
            future = self.batcher.submit(key, sentences, lengths)
        except ClientBusy as e:
            raise RequestError(429, str(e), RETRY_AFTER) from None
        except (QueueFull, Stopping) as e:
            raise RequestError(503, str(e), RETRY_AFTER) from None
        self.clients.add(client, future, len(sentences))
        try:
            left = self.limits.timeout - (time.perf_counter() - start)
            results = await self.outcome(future, request, left)
        except RequestError:
            raise
        except Exception as e:  # the batch failed (logged with its traceback by the worker)
            raise RequestError(500, f"the translation failed: {e}") from None
        translations = []
        for sentence, result in zip(sentences, results):
            warning = self.models.models[key[0]].served.warning(sentence)
            translations.append({**result, "warning": warning} if warning else result)
        return {"translations": translations}

    async def outcome(self, future: Future[list[Any]], request: Request, seconds: float) -> list[Any]:
        """The results of a submitted request within `seconds` (what is left of --timeout); cancels the request (its
        queued sentences are dropped) on 504, when the client disconnects, or when the server aborts."""
        waiter: asyncio.Future[Any] = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(client_gone(request))
        aborted = asyncio.ensure_future(self.aborted.wait())
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
            raise Aborted(self.abort_reason)
        raise RequestError(504, f"the request was not done within --timeout {self.limits.timeout:g} s")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready_check(self, request: Request) -> Response:
        ready = self.batcher.ready.is_set()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    async def info(self, request: Request) -> Response:
        try:
            self.check_key(request)
        except RequestError as e:
            return error(e.status, str(e), request, e.headers)
        if "model" not in request.query_params:
            return JSONResponse(self.models.info())
        try:
            return JSONResponse(self.models.named_model(request.query_params["model"]).served.info)
        except NmtError as e:
            return error(400, str(e), request)

    async def metrics_text(self, request: Request) -> Response:
        try:
            self.check_key(request)
        except RequestError as e:
            return error(e.status, str(e), request, e.headers)
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.batcher.start()  # unless `nmt serve` started it (and warmed it up) before listening
        try:
            yield
        finally:  # every open request was answered (its results, or 503 after `abort`); the queue is finished
            await asyncio.get_running_loop().run_in_executor(None, self.batcher.stop, self.stop_wait)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404, 405) as JSON too."""
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, str(exc.detail), request)


async def server_error(request: Request, exc: Exception) -> Response:
    """A failure of the server's own as JSON too (Starlette still logs its traceback: it is a bug)."""
    return error(500, f"the server failed: {type(exc).__name__}: {exc}", request)


def build_app(models: Models, batcher: Batcher, metrics: Metrics, limits: Limits) -> Starlette:
    server = Server(models, batcher, metrics, limits)
    routes = [
        Route("/", server.page, methods=["GET"]),
        Route("/translate", server.translate, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/ready", server.ready_check, methods=["GET"]),
        Route("/info", server.info, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
        Route("/languages", libretranslate.languages_route([m.served.info for m in models]), methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    middleware = [Middleware(AccessLog), *cors(limits.cors_origins)]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=server.lifespan,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.server = server
    return app


def make_app(served: ServedModel | Models, max_wait: float, max_queue: int, limits: Limits) -> Starlette:
    """The app with its own batcher and metrics: the one place they are wired together. `served`: the models
    (Models.open), or one ServedModel."""
    models = served if isinstance(served, Models) else Models.one(served)
    batcher = models.batcher(max_wait, max_queue)
    metrics = Metrics(lambda: batcher.queue_length, [model.name for model in models])
    batcher.on_batch = lambda key, *counts: metrics.batch(model_of(key), *counts)
    batcher.on_step = lambda key, seconds: metrics.searched(model_of(key), seconds)
    return build_app(models, batcher, metrics, limits)
