"""Where a served sentence's time goes, in one process, without HTTP: the counterpart of bench_serve.py that
splits its figures.

One sentence at a time (bench_serve.py's one client), alternated --rounds times, ms per sentence:
- `thread`: translate() on a thread of its own, one sentence a call (what `nmt generate --batch-size 1` does);
- `batcher`: serve's ServedModel and Batcher (serve/served_model.py, batcher.py), each sentence submitted and waited for
  as a client would, without the HTTP server around them.
If `batcher` is slower than `thread`, the time goes in the batcher; if it is not, and bench_serve.py's one client
is slower than generate, in the HTTP server's process around them. Every search here runs on a thread that ends
before the next one starts, and the main thread runs none (`alone`: two OpenMP teams alive at once slow both).

--clients N (bench_serve.py's 32 one-sentence clients, without HTTP), sentences per second over the first
--sentences sentences, alternated --rounds times:
- `sorted N`: translate() in batches of N sentences of like length (what `nmt generate --batch-size N` does);
- `arrival N`: translate() on consecutive chunks of N sentences, each one batch (a batcher that always filled
  its batches: what the composition of the batches a server gets costs);
- `batcher`: N client threads each submitting one sentence at a time to serve's Batcher, with its mean batch,
  the worker's share of the time searching, the decoder steps per batch, the search's ms per step and the
  requests' p50 and p99 latency.
bench_serve.py's figure against `batcher`'s is what HTTP (event loop, JSON, the clients' own work) costs.

--event-loop: the CPU time per /translate request of serve's Starlette app, called in-process by a minimal ASGI
caller (no sockets, no uvicorn), its worker answering each batch at once without searching: what the checks,
encoding, batcher bookkeeping and JSON take from the event loop (and, on the CPU, from the worker's GIL), with
32 requests at once, and the functions that take most of it (cProfile).

The server's own figures come from bench_serve.py.

    python benchmarks/profile_serve.py --path CKPT --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import pstats
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from common import MULTI30K

from nmt_cli.config import ServeConfig
from nmt_cli.runtime import AMP_DTYPES, set_threads
from nmt_cli.search.translate import SearchRequest, Translator, load_translator, translate
from nmt_cli.serve.app import Limits, make_app
from nmt_cli.serve.batcher import Batcher
from nmt_cli.serve.models import Models, key_of
from nmt_cli.serve.queued import Answer
from nmt_cli.serve.served_model import ServedModel
from nmt_cli.steps import Steps

T = TypeVar("T")


def alone(work: Callable[[], T]) -> T:
    """`work()` on a thread of its own, waited for. PyTorch's CPU ops run on the calling thread's OpenMP team,
    which lives as long as that thread; while two teams live (GNU OpenMP, 2 of them on 2 cores: more threads than
    cores), every parallel op of either waits for its team by sleeping instead of spinning, about 3x slower on
    2 Zen 3 cores (94 against 320 us a small product). `nmt serve` runs torch on its worker thread only; so that
    the figures here are that server's, the main thread runs none (loading included), and every search here runs
    on a thread that ends before the next one starts: each variant's own, or a batcher's worker, stopped after its
    round."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    if not out:
        raise SystemExit("the thread failed (its traceback is above)")
    return out[0]


def load(args: argparse.Namespace, config: ServeConfig) -> tuple[ServedModel, Translator]:
    """The server's model and a translator of the same checkpoint, search and precision (loaded alone)."""

    def both() -> tuple[ServedModel, Translator]:
        served = ServedModel(config, {"beam": args.beam})
        # the precision generate and serve choose (the checkpoint's on CUDA)
        translator, _ = load_translator(args.path, torch.device(args.device), AMP_DTYPES[served.precision])
        # the server's search (--fixed-slots), so that the ways compare alike
        translator = replace(translator, slots=served.searcher.inference.slots)
        return served, translator

    return alone(both)


def started(served: ServedModel, config: ServeConfig) -> tuple[Batcher, Any]:
    """A batcher as `nmt serve` makes it, started and warm, and its key for the model's search."""
    models = Models.one(served)
    batcher = models.batcher(config.max_wait_ms / 1000, config.max_queue)
    batcher.start()
    batcher.ready.wait()
    return batcher, key_of(models.default, served.search)


def one_at_a_time(args: argparse.Namespace, lines: list[str]) -> None:
    config = ServeConfig(path=str(args.path), device=args.device, fixed_slots=args.fixed_slots)
    served, translator = load(args, config)
    cfg = served.search
    sources = translator.vocab.encode_arrays(lines)

    def loop() -> None:
        with torch.inference_mode():
            for src in sources:
                translate(translator, SearchRequest([src], cfg, served.max_tokens))

    def through_batcher() -> None:
        batcher, key = started(served, config)
        t = time.perf_counter()
        for line in lines:
            s = served.reader.prepare([line])
            batcher.submit(key, s, [served.reader.length(x) for x in s]).result()
        took.append(time.perf_counter() - t)
        batcher.stop()

    alone(loop)  # warm-up
    times: dict[str, list[float]] = collections.defaultdict(list)
    took: list[float] = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        alone(loop)
        times["thread"].append((time.perf_counter() - t) / len(lines) * 1000)
        through_batcher()  # timed without its start and warm-up
        times["batcher"].append(took.pop() / len(lines) * 1000)
    print(f"one sentence at a time ({len(lines)} sentences, {args.rounds} rounds alternated), ms per sentence:")
    for name, ms in times.items():
        print(f"  {name:>18}  " + "  ".join(f"{x:7.1f}" for x in ms) + f"   median {statistics.median(ms):7.1f}")


def many_clients(args: argparse.Namespace, lines: list[str]) -> None:
    """--clients: sentences/s of translate() in sorted and in arrival-order batches of N, and of N client threads
    on serve's Batcher, alternated --rounds times (one process, no HTTP)."""
    config = ServeConfig(path=str(args.path), device=args.device, fixed_slots=args.fixed_slots)
    served, translator = load(args, config)
    cfg, n = served.search, args.clients
    sources = translator.vocab.encode_arrays(lines)
    batches: list[int] = []  # the sentences of each batch
    searching = [0.0]  # seconds
    steps = [0]

    def counting(batcher: Batcher) -> Batcher:
        batcher.on_batch = lambda key, sentences, requests, waited: batches.append(sentences)
        batcher.on_step = lambda key, seconds: searching.__setitem__(0, searching[0] + seconds)
        run = batcher.run

        def counted(
            key: Any, items: list[Any], still_wanted: Callable[[], list[bool]], answer: Answer
        ) -> Steps[list[Any]]:
            search = run(key, items, still_wanted, answer)
            while True:
                try:
                    next(search)
                except StopIteration as stop:
                    return stop.value
                steps[0] += 1
                yield

        batcher.run = counted
        return batcher

    def sorted_batches() -> None:
        with torch.inference_mode():
            translate(translator, SearchRequest(sources, cfg, served.max_tokens, n))

    def arrival_batches() -> None:
        with torch.inference_mode():
            for i in range(0, len(sources), n):
                translate(translator, SearchRequest(sources[i : i + n], cfg, served.max_tokens))

    latencies: list[float] = []  # of each request (seconds)

    def through_batcher() -> float:
        prepared = [served.reader.prepare([line]) for line in lines]  # the event loop's work, not timed
        todo = iter(range(len(lines)))
        lock = threading.Lock()
        batcher, key = started(served, config)
        counting(batcher)

        def client() -> None:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                s = prepared[i]
                start = time.perf_counter()
                batcher.submit(key, s, [served.reader.length(x) for x in s]).result()
                latencies.append(time.perf_counter() - start)

        threads = [threading.Thread(target=client) for _ in range(n)]
        t = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.perf_counter() - t
        batcher.stop()
        return took

    alone(sorted_batches)  # warm-up
    rates: dict[str, list[float]] = collections.defaultdict(list)
    shares, means, per_batch, per_step, p50, p99 = [], [], [], [], [], []
    for _ in range(args.rounds):
        for name, work in ((f"sorted {n}", sorted_batches), (f"arrival {n}", arrival_batches)):
            t = time.perf_counter()
            alone(work)
            rates[name].append(len(lines) / (time.perf_counter() - t))
        batches.clear()
        searching[0] = 0.0
        steps[0] = 0
        latencies.clear()
        took = through_batcher()
        p50.append(1000 * float(np.percentile(latencies, 50)))
        p99.append(1000 * float(np.percentile(latencies, 99)))
        rates["batcher"].append(len(lines) / took)
        means.append(sum(batches) / len(batches))
        shares.append(100 * searching[0] / took)
        per_batch.append(steps[0] / len(batches))
        per_step.append(1000 * searching[0] / max(steps[0], 1))
    print(f"{n} clients ({len(lines)} sentences, {args.rounds} rounds alternated), sentences/s:")
    figures = [("mean batch", means), ("searching %", shares), ("steps/batch", per_batch), ("ms/step", per_step)]
    figures.append(("p50 ms", p50))
    for name, ms in [*rates.items(), *figures, ("p99 ms", p99)]:
        print(f"  {name:>18}  " + "  ".join(f"{x:7.1f}" for x in ms) + f"   median {statistics.median(ms):7.1f}")


async def call_app(app: Any, body: bytes) -> None:
    """One POST /translate through the ASGI app; the client stays connected until the answer is sent."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/translate",
        "raw_path": b"/translate",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    answered = asyncio.Event()
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if bodies:
            return bodies.pop()
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    await app(scope, receive, send)


def event_loop(args: argparse.Namespace, lines: list[str]) -> None:
    """--event-loop: CPU ms per request of the app with an instant worker, 32 requests at once, and a profile."""
    served = ServedModel(ServeConfig(path=str(args.path), device=args.device), {"beam": args.beam})  # no search
    app = make_app(served, 0.0, 1 << 20, Limits(max_request_sentences=100, timeout=60.0))
    batcher = app.state.server.batcher

    def instant(key: Any, items: list[Any], still_wanted: Callable[[], list[bool]], answer: Answer) -> Steps[list[Any]]:
        yield
        return [{"text": "ein Hund", "score": -1.0} for _ in items]

    batcher.run, batcher.warm_up = instant, None
    bodies = [json.dumps({"text": line}).encode() for line in lines]

    async def load() -> None:
        for i in range(0, len(bodies), 32):
            await asyncio.gather(*(call_app(app, body) for body in bodies[i : i + 32]))

    async def measure() -> None:
        async with app.router.lifespan_context(app):
            await load()  # warm-up
            ms = []
            for _ in range(args.rounds):
                t = time.thread_time()
                await load()
                ms.append((time.thread_time() - t) / len(bodies) * 1000)
            print(f"event loop, {len(bodies)} requests 32 at a time, CPU ms per request:")
            print("  " + "  ".join(f"{x:7.3f}" for x in ms) + f"   median {statistics.median(ms):7.3f}")
            profile = cProfile.Profile()
            profile.enable()
            await load()
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(r"nmt_cli|starlette", 30)

    asyncio.run(measure())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, required=True)
    ap.add_argument("--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--single", type=int, default=50, help="Sentences searched one at a time.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=0, help="Also N client threads on the Batcher (0: not).")
    ap.add_argument("--sentences", type=int, default=500, help="Sentences sent by the --clients.")
    ap.add_argument("--event-loop", action="store_true", help="Only the event loop's CPU time per request.")
    ap.add_argument("--fixed-slots", action="store_true", help="Search as `nmt serve --fixed-slots` does.")
    args = ap.parse_args()
    set_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    if args.event_loop:
        event_loop(args, lines[: args.sentences])
        return
    one_at_a_time(args, lines[: args.single])
    if args.clients:
        many_clients(args, lines[: args.sentences])


if __name__ == "__main__":
    main()
