"""The HTTP side of `nmt serve`: a Starlette app around the served models (Models, models.py) and their Batcher.

POST /translate  {"text": "..."} or {"texts": [...]}, optional "model" (a name; default: the first --path) and
                 search fields -> {"translations": [{"text", "score", "alignment"?, "nbest"?, "warning"?}], "seconds"}
GET /health, /ready (503 until every model is warm), /info (?model=NAME: that model's), /metrics (Prometheus),
/ (a page to translate with), /openapi.json (openapi.py: every route and error status). LibreTranslate's
/translate body, /languages and /frontend/settings: libretranslate.py; its POST /detect: detect.py.

Every error is JSON {"error": "...", "request_id": "..."}; /translate, /info and /metrics need `Authorization:
Bearer KEY` where the server has a key. A large body is parsed and its texts encoded on a thread, so that the event
loop (and /health) is not held up by them. At shutdown (`drain`, `abort`: drain.py) the requests already open go
on; `abort` answers those still open with 503 at once and cancels their queued sentences.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from nmt_cli.errors import NmtError
from nmt_cli.serve import libretranslate
from nmt_cli.serve.access import AccessLog, authorized, bearer_key, cors
from nmt_cli.serve.batcher import Batcher
from nmt_cli.serve.body import RequestError, read_json, request_rules, request_texts
from nmt_cli.serve.clients import ClientBusy, ClientLoad
from nmt_cli.serve.detect import Detector
from nmt_cli.serve.keys import Keys
from nmt_cli.serve.libretranslate import answering, frontend_settings
from nmt_cli.serve.limits import RateCounter, RateLimit
from nmt_cli.serve.metrics import Metrics
from nmt_cli.serve.models import Models, key_of, model_of
from nmt_cli.serve.openapi import document
from nmt_cli.serve.page import PAGE
from nmt_cli.serve.queued import QueueFull, Stopping
from nmt_cli.serve.request import Sentence
from nmt_cli.serve.served_model import ServedModel
from nmt_cli.serve.waiting import RETRY_AFTER, Abort, Aborted, body_of, outcome

logger = logging.getLogger(__name__)

OFFLOAD_BYTES = 64 << 10  # a body longer than this is parsed and encoded on a thread, off the event loop
KEY_NEEDED = (
    "this server needs its API key: send `Authorization: Bearer KEY` (a LibreTranslate body with `q` may instead "
    "give it as api_key)"
)


@dataclass
class Limits:
    max_request_sentences: int
    timeout: float  # seconds
    max_body_bytes: int = 8 << 20
    api_key: str | Keys | None = None  # None: no key asked; Keys: several (--api-key-file)
    cors_origins: tuple[str, ...] = ()
    max_client_sentences: int | None = None  # None: no limit per client
    metrics_token: str | None = None  # None: /metrics takes the API key, open without one
    rate: RateLimit = field(default_factory=RateLimit)  # requests and characters per client over time


def error(status: int, message: str, request: Request | None = None, headers: dict[str, str] | None = None) -> Response:
    body = {"error": message}
    if request is not None and "request_id" in request.scope.get("state", {}):
        body["request_id"] = request.scope["state"]["request_id"]
    return JSONResponse(body, status_code=status, headers=headers)


class Server:
    """The routes, sharing the served models, their batcher and one set of counters."""

    def __init__(self, models: Models, batcher: Batcher, metrics: Metrics, limits: Limits) -> None:
        self.models, self.batcher, self.metrics, self.limits = models, batcher, metrics, limits
        self.clients = ClientLoad(limits.max_client_sentences)
        self.rates = RateCounter(limits.rate)
        self.detector = Detector([model.served.info for model in models])
        self.open_requests = 0  # /translate requests not yet answered
        self.draining = False  # set by `drain`: the server is shutting down
        self.unready = False  # set at a stop signal: /ready answers 503 (--drain-grace)
        self.answered_in_drain: Counter[int] = Counter()  # the status of each request answered since
        self.aborted_requests = 0  # of them, those answered 503 by `abort`
        self.aborted = Abort()  # set by `abort`: every open request is answered 503 at once
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
        self.aborted.reason, self.stop_wait = reason, stop_wait
        self.aborted.event.set()

    async def translate(self, request: Request) -> Response:
        start = time.perf_counter()
        n_sentences = request.state.sentences = 0  # for the access log: 0 until the body is read
        model = None  # the model the request asks for, once its body is read
        self.open_requests += 1
        try:
            limits = self.limits
            body = await body_of(request, max_bytes=limits.max_body_bytes, timeout=limits.timeout, abort=self.aborted)
            # the client of the limits over time: its key's id where keys are, else its address
            key = bearer_key(request.headers.get("authorization"), limits.api_key) if limits.api_key else None
            request.state.key_id = key.id if key else None  # for the access log
            client = key.id if key else request.client.host if request.client else "unknown"
            parse = partial(self.parse, body, request.headers, request.url.query, client, key.rate if key else None)
            # A large body's JSON and sentencepiece encoding take long enough to stall every other request
            parsed = await run_in_threadpool(parse) if len(body) > OFFLOAD_BYTES else parse()
            n_sentences = request.state.sentences = len(parsed[0])
            model = request.state.model = model_of(parsed[1])
            request.state.tokens = sum(parsed[2])  # source pieces, for the access log
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

    def parse(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        query: str = "",
        client: str | None = None,
        rate: RateLimit | None = None,
    ) -> libretranslate.Parsed:
        """A /translate body (and query string) read, ours or LibreTranslate's: texts encoded, search settings,
        lengths, Shape; 429 past a limit over time of the `client` (None: none counted): `rate`, its key's own,
        else the server's."""
        try:
            payload = self.read(body, headers, query)
            detected = self.detector.resolve(payload)  # LibreTranslate's source "auto": the language of its texts
            model = self.models.choose(payload)  # which takes our "model" field out of the payload
            one = isinstance(payload, dict) and "text" in payload
            payload, libre = libretranslate.translate_body(payload, model.served.info, detected)
            texts, fields = request_texts(payload, self.limits.max_request_sentences)
            if client is not None and (passed := self.rates.take(client, sum(map(len, texts)), rate)):
                wait = str(math.ceil(passed[1]))
                raise RequestError(429, f"{client} is past {passed[0]}: retry in {wait} s", {"Retry-After": wait})
            n = len(texts)
            # errors name a text by the request's own field for it: "text" (ours, of one), "q", "q[J] (sentence K)"
            names = [libre.field_of(i) for i in range(n)] if libre else ["text"] if one else None
            search, sentences = model.served.reader.read(texts, fields, request_rules(payload, n), names)
        except NmtError as e:
            raise RequestError(400, str(e)) from None
        return sentences, key_of(model, search), [model.served.reader.length(s) for s in sentences], libre

    def read(self, body: bytes, headers: Mapping[str, str] | None, query: str) -> Any:
        """A /translate or /detect request's fields (libretranslate.read), 401 unless it carries the API key."""
        payload, keyed = libretranslate.read(body, headers, self.limits.api_key, read_json, query)
        if not keyed:  # neither the header nor LibreTranslate's body carries the key
            raise RequestError(401, KEY_NEEDED, {"WWW-Authenticate": "Bearer"})
        return payload

    async def detect(self, request: Request) -> Response:
        try:
            limits = self.limits
            body = await body_of(request, max_bytes=limits.max_body_bytes, timeout=limits.timeout, abort=self.aborted)
            return JSONResponse(self.detector.detect(self.read(body, request.headers, request.url.query)))
        except RequestError as e:
            return error(e.status, str(e), request, e.headers)
        except NmtError as e:
            return error(400, str(e), request)

    def answered(self, status: int, sentences: int, seconds: float, model: str | None) -> None:
        self.metrics.request(status, sentences, seconds, model)
        if self.draining:
            self.answered_in_drain[status] += 1

    async def answer(
        self, request: Request, sentences: list[Sentence], key: tuple[str, Any], lengths: list[int], start: float
    ) -> dict:
        # the client: its address (uvicorn's, from a trusted proxy's X-Forwarded-For), for its share of the worker
        # (fair.py) and --max-client-sentences; the one API key every client sends tells none apart
        client = request.client.host if request.client else "unknown"
        try:
            self.clients.check(client, len(sentences))
            future = self.batcher.submit(key, sentences, lengths, client)
        except ClientBusy as e:
            raise RequestError(429, str(e), RETRY_AFTER) from None
        except (QueueFull, Stopping) as e:
            raise RequestError(503, str(e), RETRY_AFTER) from None
        self.clients.add(client, future, len(sentences))
        try:
            left = self.limits.timeout - (time.perf_counter() - start)
            results = await outcome(future, request, seconds=left, timeout=self.limits.timeout, abort=self.aborted)
        except RequestError:
            raise
        except Exception as e:  # the batch failed (logged with its traceback by the worker)
            raise RequestError(500, f"the translation failed: {e}") from None
        translations = []
        for sentence, result in zip(sentences, results):
            warning = self.models.models[key[0]].served.reader.warning(sentence)
            translations.append({**result, "warning": warning} if warning else result)
        return {"translations": translations}

    async def ready_check(self, request: Request) -> Response:
        ready = self.batcher.ready.is_set() and not self.unready
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    async def info(self, request: Request) -> Response:
        if not authorized(request.headers.get("authorization"), self.limits.api_key):
            return error(401, KEY_NEEDED, request, {"WWW-Authenticate": "Bearer"})
        if "model" not in request.query_params:
            return JSONResponse(self.models.info())
        try:
            return JSONResponse(self.models.named_model(request.query_params["model"]).served.info)
        except NmtError as e:
            return error(400, str(e), request)

    async def metrics_text(self, request: Request) -> Response:
        """Prometheus' text, for its --metrics-token, else the API key (open where the server has neither)."""
        if not authorized(request.headers.get("authorization"), self.limits.metrics_token or self.limits.api_key):
            why = KEY_NEEDED if self.limits.metrics_token is None else "send `Authorization: Bearer` --metrics-token"
            return error(401, why, request, {"WWW-Authenticate": "Bearer"})
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
    infos = [model.served.info for model in models]
    routes = [
        Route("/", server.page, methods=["GET"]),
        Route("/translate", server.translate, methods=["POST"]),
        Route("/health", answering({"status": "ok"}), methods=["GET"]),
        Route("/ready", server.ready_check, methods=["GET"]),
        Route("/info", server.info, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
        Route("/detect", server.detect, methods=["POST"]),
        Route("/languages", libretranslate.languages_route(infos), methods=["GET"]),
        Route("/frontend/settings", answering(frontend_settings(infos, limits.api_key is not None)), methods=["GET"]),
        Route("/openapi.json", answering(document()), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AccessLog), *cors(limits.cors_origins)],
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
