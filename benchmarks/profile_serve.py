"""Where a served sentence's time goes, in one process, without HTTP: the counterpart of bench_serve.py that
splits its figures.

1. One sentence at a time (bench_serve.py's one client), alternated --rounds times, ms per sentence:
   - `main`: translate() on the main thread, one sentence a call (what `nmt generate --batch-size 1` does);
   - `thread`: the same loop on a second thread, the main one waiting (the server searches on a worker thread);
   - `batcher whole`, `batcher in-flight`: serve's Engine and Batcher (serve/engine.py, batcher.py), each
     sentence submitted and waited for as a client would, without the HTTP server around them.
   If `batcher` is slower than `main`, the time goes in the batcher or the worker thread; if it is not, and
   bench_serve.py's one client is slower than generate, in the HTTP server's process around them.
2. 32 sentences in flight (search/pool.py's BeamPool kept full in-process: a finished sentence's place is
   taken by the next at the following step, as 32 clients in a loop would), against beam_search in sorted
   batches of 32: ms per step, split by what the step did (nothing but search, sentences left, sentences
   joined, both), with the host time spent in decode_step. On a GPU a step waits for the device once (which
   sentences are done), so a step's time is the host's or the device's, whichever is longer.

On the CPU both searches of part 1 share one process, so they also share its OpenMP thread pools; the
server's own figures come from bench_serve.py.

    python benchmarks/profile_serve.py --path CKPT --device cuda
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch
from common import MULTI30K

from nmt_cli.config import ServeConfig
from nmt_cli.runtime import AMP_DTYPES, set_threads
from nmt_cli.search.pool import BeamPool
from nmt_cli.search.translate import load_translator, translate
from nmt_cli.serve.engine import Engine


def one_at_a_time(args: argparse.Namespace, lines: list[str]) -> None:
    configs = {b: ServeConfig(path=str(args.path), device=args.device, batching=b) for b in ("whole", "in-flight")}
    engines = {b: Engine(cfg, {"beam": args.beam}) for b, cfg in configs.items()}
    # the precision generate and serve choose (the checkpoint's on CUDA)
    tr, _ = load_translator(args.path, torch.device(args.device), AMP_DTYPES[engines["whole"].precision])
    cfg = engines["whole"].search
    sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(lines)]

    def loop() -> None:
        with torch.inference_mode():
            for src in sources:
                translate(tr, [src], cfg, engines["whole"].max_tokens)

    def on_thread() -> None:
        t = threading.Thread(target=loop)
        t.start()
        t.join()

    batchers = {}
    for name, e in engines.items():
        b = e.batcher(configs[name].max_wait_ms / 1000, configs[name].max_queue)  # as `nmt serve` makes it
        b.start()
        b.ready.wait()
        batchers[name] = (b, e)

    def through(name: str):
        b, e = batchers[name]

        def go() -> None:
            for line in lines:
                s = e.prepare([line])
                b.submit(e.search, s, [e.length(x) for x in s]).result()

        return go

    variants = {
        "main": loop,
        "thread": on_thread,
        "batcher whole": through("whole"),
        "batcher in-flight": through("in-flight"),
    }
    loop()  # warm-up of the main thread's translator
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, run in variants.items():
            t = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t) / len(lines) * 1000)
    for b, _ in batchers.values():
        b.stop()
    print(f"one sentence at a time ({len(lines)} sentences, {args.rounds} rounds alternated), ms per sentence:")
    for name, ms in times.items():
        print(f"  {name:>18}  " + "  ".join(f"{x:7.1f}" for x in ms) + f"   median {statistics.median(ms):7.1f}")


def in_flight(args: argparse.Namespace, lines: list[str]) -> None:
    device = torch.device(args.device)
    e = Engine(ServeConfig(path=str(args.path), device=args.device), {"beam": args.beam})
    tr = e.tr
    cfg = e.search
    sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(lines)]
    model, decode = tr.model, tr.model.decode_step
    calls, spent = [0], [0.0]  # decode_step's calls and host seconds, reset where counted

    def timed(prev, cache):
        t = time.perf_counter()
        out = decode(prev, cache)
        calls[0] += 1
        spent[0] += time.perf_counter() - t
        return out

    model.decode_step = timed
    slots = args.clients
    with torch.inference_mode():
        for rnd in range(args.rounds):
            pool = BeamPool(model, cfg, tr.vocab.n_pieces, device, tr.amp_dtype)
            pool.add(sources[:slots], list(range(slots)))
            nxt, waiting, done = slots, 0, 0
            steps = collections.defaultdict(list)
            start = time.perf_counter()
            while done < len(sources):
                joined = False
                if waiting:
                    n = min(waiting, len(sources) - nxt)
                    pool.add(sources[nxt : nxt + n], list(range(nxt, nxt + n)))
                    nxt, waiting, joined = nxt + n, 0, n > 0
                spent[0] = 0.0
                t = time.perf_counter()
                out = pool.step()
                steps[(joined, bool(out))].append((time.perf_counter() - t, spent[0]))
                done += len(out)
                waiting += len(out)
            pool_s = time.perf_counter() - start
            calls[0], spent[0] = 0, 0.0
            t = time.perf_counter()
            translate(tr, sources, cfg, e.max_tokens, slots)
            sorted_s = time.perf_counter() - t
            n_pool = sum(len(v) for v in steps.values())
            print(
                f"round {rnd + 1}: {slots} in flight {len(sources) / pool_s:.1f} sent/s ({n_pool} steps, "
                f"{pool_s / n_pool * 1000:.2f} ms/step); beam_search in sorted batches of {slots} "
                f"{len(sources) / sorted_s:.1f} sent/s ({calls[0]} steps, {sorted_s / calls[0] * 1000:.2f} "
                f"ms/step, decode_step's host time {spent[0] / calls[0] * 1000:.2f} ms/step)"
            )
            for (joined, left), v in sorted(steps.items()):
                what = {
                    (False, False): "search only",
                    (False, True): "some left",
                    (True, False): "some joined",
                    (True, True): "joined and left",
                }[(joined, left)]
                print(
                    f"  {what:>16}: {len(v):5d} steps, median {statistics.median(x for x, _ in v) * 1000:6.2f} ms, "
                    f"decode_step's host time {statistics.median(d for _, d in v) * 1000:6.2f} ms"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, required=True)
    ap.add_argument("--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--single", type=int, default=50, help="Sentences of part 1.")
    ap.add_argument("--sentences", type=int, default=500, help="Sentences of part 2.")
    ap.add_argument("--clients", type=int, default=32, help="Sentences in flight in part 2.")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    set_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    one_at_a_time(args, lines[: args.single])
    in_flight(args, lines[: args.sentences])


if __name__ == "__main__":
    main()
