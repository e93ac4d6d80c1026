"""Where a CPU beam-search step's time goes: the generation counterpart of profile_step.py.

Beam search as `nmt generate` runs it on the CPU in float32 (the linears packed as `load_translator` packs
them, 2 threads, batches of 64 Multi30k test sentences, beam 4, every hypothesis forced to 24 tokens as in
bench_generate.py and the peer harness), on a checkpoint of each shape:

- ms/step: a whole translation's wall time over its decoding steps; encoder: its share spent encoding.
- linears ms/step: the decoding step's linear products inside the search (operator time from the
  profiler); alone: the same modules (same weights, same route) timed by themselves on as many rows, the
  machine's limit for that work; GFLOP/s inside.
- the search's operator time by group (the cache reorder is index_select, the attention products bmm; "cross
  K/V": the cross-attention keys and values, projected once per sentence) and "outside ops": Python and the
  framework between operators. These shares come from a run under torch.profiler, which slows the
  memory-bound cache reorder most: base's reorder (`append_step`) took 0.68 s of a 15.1 s translation
  timed without it and 3.23 s of 17.2 s under it (2 cores of an AMD Zen 3), so read that group as an
  upper bound.
- floor ms/step: the same search (layers, heads, beam, rows and steps) on a model 4 wide per head with a
  64-piece vocabulary, where there is next to no arithmetic: what each step costs in interpreter,
  dispatch and kernel-call overhead.
- CT2 ms/step and CT2 floor: where ctranslate2 is installed, CTranslate2 (float32, same threads, beam, batch
  and 25 forced decoding steps, nmt's 24 tokens plus EOS) on the same model and on the floor's model,
  exported with nmt's own converter, run by a child process that waits while nmt runs: the side-by-side
  split of a gap into the part that is arithmetic and the part that is per-step overhead. (Inside nmt's
  process CTranslate2 adds a second OpenMP runtime next to PyTorch's, and nmt's searches alternated with it
  there ran several percent slower than alone.) Every ms/step divides a whole translation
  (encoder included) by the same count of decoding steps; each translation runs --repeat times, the four
  kinds alternated, and the fastest of each counts.

    python benchmarks/profile_generate.py --shapes small,base --sentences 256 --repeat 3
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import BATCH, FORCED_SEARCH, checkpoint, data_bin, report
from profile_step import GROUPS, group_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nmt_cli.search.translate as translate_module  # noqa: E402
from nmt_cli.allocator import tune_allocator  # noqa: E402
from nmt_cli.config import ModelConfig, SearchConfig  # noqa: E402
from nmt_cli.data.dataset import ParallelDataset  # noqa: E402
from nmt_cli.data.vocab import BOS, EOS, UNK, Vocab  # noqa: E402
from nmt_cli.model.linear import ONEDNN_AVAILABLE, pack_for_cpu_inference  # noqa: E402
from nmt_cli.model.transformer import Transformer, build_model  # noqa: E402
from nmt_cli.search.translate import SearchRequest, Translator, load_translator, translate  # noqa: E402

FORCED = SearchConfig(**FORCED_SEARCH)
CROSS = "cross K/V"  # the search's cross-attention keys and values, projected once per sentence (init_cache)
GEN_GROUPS = (  # the first group whose key is in the operator's name takes it; then profile_step's groups
    ("attention products", ("bmm",)),
    ("cache reorder", ("index_select",)),
    ("top-k", ("topk",)),
)


class Counters:
    """What the wrapped search reports: seconds in the encoder and in the searches, steps and rows."""

    def __init__(self) -> None:
        self.encode_s = self.search_s = 0.0
        self.steps = self.rows = 0


def instrument(translator: Translator, counters: Counters, label: bool) -> Callable[[], None]:
    """Time the encoder and the searches of `translate` and count decoding steps and rows; label: name the
    searches for the profiler. Returns the function that undoes it."""
    model, search = translator.model, translate_module.beam_search
    encode, decode_step, init_cache = model.encode, model.decode_step, model.init_cache

    def timed_encode(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = encode(*args, **kwargs)
        counters.encode_s += time.perf_counter() - start
        return out

    def counted_step(prev: torch.Tensor, cache: Any) -> Any:
        counters.steps += 1
        counters.rows += prev.shape[0]
        return decode_step(prev, cache)

    def labelled_init_cache(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(CROSS):
            return init_cache(*args, **kwargs)

    def timed_search(m: Transformer, enc: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        if label:
            with torch.profiler.record_function("beam_search"):
                out = search(m, enc, *args, **kwargs)
        else:
            out = search(m, enc, *args, **kwargs)
        counters.search_s += time.perf_counter() - start
        return out

    model.encode, model.decode_step, translate_module.beam_search = timed_encode, counted_step, timed_search
    if label:
        model.init_cache = labelled_init_cache

    def undo() -> None:
        del model.encode, model.decode_step
        if label:
            del model.init_cache
        translate_module.beam_search = search

    return undo


def step_linears(model: Transformer, cfg: ModelConfig) -> list[tuple[torch.nn.Module, int, int]]:
    """(module, in width, count) of every linear a decoding step runs on each row: each decoder layer's
    self-attention QKV and output, cross-attention query and output, feed-forward, and the output projection."""
    layer, n = model.decoder[0], cfg.decoder_layers
    d, f = cfg.d_model, cfg.d_ff
    mods = [layer.self_attn.qkv, layer.self_attn.out, layer.cross_attn.q, layer.cross_attn.out, layer.ffn.fc1]
    return [(m, d, n) for m in mods] + [(layer.ffn.fc2, f, n), (model.output, d, 1)]


def alone(model: Transformer, cfg: ModelConfig, rows: int, repeat: int = 10) -> tuple[float, int]:
    """One step's linears on `rows` rows, each module timed by itself (median): (seconds, the weights' size
    summed over the step, in multiply-adds per row)."""
    seconds, weights = 0.0, 0
    with torch.inference_mode():
        for module, width, count in step_linears(model, cfg):
            x = torch.randn(rows, width)
            times = []
            for _ in range(repeat + 3):
                start = time.perf_counter()
                y = module(x)
                times.append(time.perf_counter() - start)
            seconds += count * float(np.median(times[3:]))
            weights += count * width * y.shape[-1]
    return seconds, weights


def floor_config(cfg: ModelConfig) -> ModelConfig:
    """The shape's layers and heads, 4 wide per head, a 64-piece vocabulary: next to no arithmetic."""
    return ModelConfig(
        vocab_size=64,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        d_model=4 * cfg.heads,
        d_ff=4 * cfg.heads,
        heads=cfg.heads,
    )


# CTranslate2 runs in a child process: in nmt's process it brings a second OpenMP runtime (its own libgomp)
# next to PyTorch's, and nmt's searches alternated with it there measured several percent slower than alone.
CT2_CHILD = """
import json, sys, time
import ctranslate2
model_dir, batch = sys.argv[1], json.load(open(sys.argv[2]))
translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="float32", inter_threads=1, intra_threads=2)
options = json.loads(sys.argv[3])
translator.translate_batch(batch[: options["max_batch_size"]], **options)
for _ in sys.stdin:
    start = time.perf_counter()
    translator.translate_batch(batch, **options)
    print(time.perf_counter() - start, flush=True)
"""


def ct2_runner(
    model: Transformer, cfg: ModelConfig, vocab: Vocab, sources: list[np.ndarray], workdir: Path
) -> Callable[[], float] | None:
    """A function that times CTranslate2 translating `sources` (float32, 2 threads, beam 4, batches of 64, 25
    forced decoding steps) with `model` (unpacked) exported by nmt's converter into `workdir`, in a child
    process that waits for each run; None without ctranslate2."""
    try:
        import ctranslate2

        from nmt_cli.export.to_ctranslate2 import build_spec, vocabulary
    except ImportError:
        return None
    tokens = vocabulary(vocab, max(cfg.vocab_size, vocab.n_pieces))[: cfg.vocab_size]
    spec = build_spec(model.eval(), cfg, tokens, {"unk": tokens[UNK], "bos": tokens[BOS], "eos": tokens[EOS]})

    class Converter(ctranslate2.converters.Converter):  # type: ignore[misc]
        def _load(self) -> Any:
            return spec

    Converter().convert(str(workdir), force=True)
    (workdir / "batch.json").write_text(json.dumps([[tokens[i] for i in s] for s in sources]))
    options = {"beam_size": 4, "max_batch_size": BATCH, "length_penalty": 0.6}
    options |= {"min_decoding_length": 25, "max_decoding_length": 25}
    args = [sys.executable, "-c", CT2_CHILD, str(workdir), str(workdir / "batch.json"), json.dumps(options)]
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout
    atexit.register(child.kill)

    def run() -> float:
        stdin.write("run\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError("CTranslate2's child process stopped (its error is printed above)")
        return float(line)

    return run


def nmt_runner(translator: Translator, sources: list[np.ndarray], counters: Counters) -> Callable[[], float]:
    """A function that times `translate` of `sources` as the benchmark runs it, counting into `counters`."""
    translate(translator, SearchRequest(sources[:BATCH], FORCED, 10**9, BATCH))  # oneDNN builds its kernels

    def run() -> float:
        undo = instrument(translator, counters, label=False)
        start = time.perf_counter()
        translate(translator, SearchRequest(sources, FORCED, 10**9, BATCH))
        seconds = time.perf_counter() - start
        undo()
        return seconds

    return run


def profile(shape: str, n_sentences: int, repeat: int) -> dict[str, object]:
    path = checkpoint(shape)
    translator, saved = load_translator(path, torch.device("cpu"), None)
    cfg = saved.config
    data = ParallelDataset(data_bin(), "test")
    sources = [data.src[i] for i in range(min(n_sentences, len(data)))]
    tiny_cfg = floor_config(cfg)
    tiny_model = build_model(tiny_cfg).eval()
    tiny_sources = [s % 60 + 4 for s in sources]  # same lengths, ids within the 64 pieces (0-3 are special)
    workdir = Path(tempfile.mkdtemp(prefix="profile_generate_"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    runners = {  # CTranslate2's models are exported before the floor's model is packed
        "CT2": ct2_runner(saved.model(), cfg, translator.vocab, sources, workdir / "model"),
        "CT2 floor": ct2_runner(tiny_model, tiny_cfg, translator.vocab, tiny_sources, workdir / "floor"),
    }
    tiny = Translator(
        pack_for_cpu_inference(tiny_model) if ONEDNN_AVAILABLE else tiny_model, translator.vocab, translator.device
    )
    timing, floor = Counters(), Counters()
    runners |= {"nmt": nmt_runner(translator, sources, timing), "floor": nmt_runner(tiny, tiny_sources, floor)}
    best: dict[str, float] = {}
    for _ in range(repeat):  # alternated, the fastest of each kept: this machine's speed drifts
        for name, run in runners.items():
            if run is not None:
                best[name] = min(best.get(name, math.inf), run())
    encode_share = timing.encode_s / (timing.encode_s + timing.search_s)
    timing.steps //= repeat  # per translation
    floor.steps //= repeat

    profiled = Counters()
    undo = instrument(translator, profiled, label=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        translate(translator, SearchRequest(sources, FORCED, 10**9, BATCH))
    undo()
    groups: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():  # the searches' operators, by group; those under init_cache as CROSS
        ancestor = event.cpu_parent
        while ancestor is not None and ancestor.name not in ("beam_search", CROSS):
            ancestor = ancestor.cpu_parent
        if ancestor is not None:
            group = CROSS if ancestor.name == CROSS else group_of(event.name, GEN_GROUPS + GROUPS)
            groups[group] += event.self_cpu_time_total / 1e6
    in_ops = sum(groups.values())

    rows_per_step = timing.rows / repeat / timing.steps
    alone_s, weights = alone(translator.model, cfg, round(rows_per_step))
    linears_s = groups["matmul"] / profiled.steps

    row: dict[str, object] = {
        "shape": shape,
        "sentences": len(sources),
        "sent/s": round(len(sources) / best["nmt"], 1),
        "rows/step": round(rows_per_step),
        "ms/step": round(1e3 * best["nmt"] / timing.steps, 2),
        "CT2 ms/step": round(1e3 * best["CT2"] / timing.steps, 2) if "CT2" in best else "-",
        "encoder": f"{100 * encode_share:.0f}%",
        "linears ms/step": round(1e3 * linears_s, 2),
        "alone ms/step": round(1e3 * alone_s, 2),
        "linears GFLOP/s": round(2.0 * rows_per_step * weights / linears_s / 1e9, 1),
    }
    unused = ("attention", "dropout", "optimizer")  # no SDPA, dropout or optimizer on this path
    for name in [g for g, _ in GEN_GROUPS + GROUPS if g not in unused] + ["other", CROSS]:
        row[name] = f"{100 * groups[name] / profiled.search_s:.0f}%"
    row["outside ops"] = f"{100 * max(profiled.search_s - in_ops, 0.0) / profiled.search_s:.0f}%"
    row["floor ms/step"] = round(1e3 * best["floor"] / floor.steps, 2)
    row["CT2 floor"] = round(1e3 * best["CT2 floor"] / floor.steps, 2) if "CT2 floor" in best else "-"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--sentences", type=int, default=256, help="Test sentences searched (batches of 64).")
    parser.add_argument("--repeat", type=int, default=3, help="Timed translations of each kind, alternated.")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tune_allocator()  # as the nmt command does at start-up
    rows = [profile(shape, args.sentences, args.repeat) for shape in args.shapes.split(",")]
    report("profile_generate", rows)


if __name__ == "__main__":
    main()
