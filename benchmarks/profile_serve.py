"""Where a served sentence's time goes, in one process, without HTTP: the counterpart of bench_serve.py that
splits its figures.

One sentence at a time (bench_serve.py's one client), alternated --rounds times, ms per sentence:
- `main`: translate() on the main thread, one sentence a call (what `nmt generate --batch-size 1` does);
- `thread`: the same loop on a second thread, the main one waiting (the server searches on a worker thread);
- `batcher`: serve's ServedModel and Batcher (serve/served_model.py, batcher.py), each sentence submitted and waited for
  as a client would, without the HTTP server around them.
If `batcher` is slower than `main`, the time goes in the batcher or the worker thread; if it is not, and
bench_serve.py's one client is slower than generate, in the HTTP server's process around them.

On the CPU the searches share one process, so they also share its OpenMP thread pools; the server's own
figures come from bench_serve.py.

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
from nmt_cli.search.translate import load_translator, translate
from nmt_cli.serve.served_model import ServedModel


def one_at_a_time(args: argparse.Namespace, lines: list[str]) -> None:
    config = ServeConfig(path=str(args.path), device=args.device)
    served = ServedModel(config, {"beam": args.beam})
    # the precision generate and serve choose (the checkpoint's on CUDA)
    translator, _ = load_translator(args.path, torch.device(args.device), AMP_DTYPES[served.precision])
    cfg = served.search
    sources = [np.asarray(ids, dtype=np.int64) for ids in translator.vocab.encode(lines)]

    def loop() -> None:
        with torch.inference_mode():
            for src in sources:
                translate(translator, [src], cfg, served.max_tokens)

    def on_thread() -> None:
        t = threading.Thread(target=loop)
        t.start()
        t.join()

    batcher = served.batcher(config.max_wait_ms / 1000, config.max_queue)  # as `nmt serve` makes it
    batcher.start()
    batcher.ready.wait()

    def through_batcher() -> None:
        for line in lines:
            s = served.prepare([line])
            batcher.submit(served.search, s, [served.length(x) for x in s]).result()

    variants = {"main": loop, "thread": on_thread, "batcher": through_batcher}
    loop()  # warm-up of the main thread's translator
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, run in variants.items():
            t = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t) / len(lines) * 1000)
    batcher.stop()
    print(f"one sentence at a time ({len(lines)} sentences, {args.rounds} rounds alternated), ms per sentence:")
    for name, ms in times.items():
        print(f"  {name:>18}  " + "  ".join(f"{x:7.1f}" for x in ms) + f"   median {statistics.median(ms):7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, required=True)
    ap.add_argument("--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--single", type=int, default=50, help="Sentences searched one at a time.")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    set_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    one_at_a_time(args, lines[: args.single])


if __name__ == "__main__":
    main()
