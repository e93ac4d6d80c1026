"""GPU throughput: training target tokens/s, MFU and peak memory for transformer_base and _big, and beam-4 generation.

    python benchmarks/bench_gpu.py [--peak-tflops 989] [--max-tokens 25000] [--updates 30] [--results FILE]
    python benchmarks/bench_gpu.py --device cpu     # tiny sizes, a few seconds: checks that the script runs

Skips (exit 0) without CUDA unless --device cpu. --results appends one JSON line per figure. Training runs
the real Trainer (`nmt train`'s update: bf16 autocast, fused loss, fused AdamW, background batches, attention
backends as `nmt train` sets them) on a synthetic data directory: a 37,000-piece vocabulary
and news-like sentence lengths (WMT14 EN-DE: ~27 pieces on average), about 25k target tokens per
update as in the paper. Generation: beam 4 over 3,000 such sentences with a transformer_base in bf16;
an untrained model does not stop on its own, so every output is forced to end at 1.1 x its source
length (max_len_a 1.1, max_len_b 0), the length a trained one produces. Generation runs at the default budget
(--gen-max-tokens) and in batches of 32 sentences, each with today's search, the fixed-slot search eagerly and
with its steps captured as CUDA graphs (`nmt generate --fixed-slots`, --cuda-graphs; search/slots.py), and counts
the best translations that differ from today's search.

Model FLOPs (counted from each batch's real lengths, padding excluded; multiply-add = 2 FLOPs;
backward = 2 x forward, so training = 3 x forward = the "6 x parameters" rule):
    6 * (P_enc * n_src + P_dec * n_tgt + D * V * n_tgt)             dense layers and output projection
  + 3 * 4 * D * (L_enc * sum(s_i^2) + L_dec * sum(s_i * t_i))        encoder self-, cross-attention scores
  + 3 * 2 * D * L_dec * sum(t_i^2)                                   causal decoder self-attention (half)
P_enc / P_dec: parameters of the encoder / decoder layers (embeddings excluded), D d_model, V vocabulary,
L layers, s_i / t_i the sentences' source / target lengths (with EOS), n_src / n_tgt their sums.
Generation MFU uses the forward terms only (a third), with incremental decoding's attention over the prefix.
MFU = model FLOP/s / the device's dense bf16 peak (table below, or --peak-tflops).

Also per architecture: GPU busy % (the union of the kernels' time over the wall time of --busy-updates more
updates under torch.profiler; the kernels of overlapping streams count once) and the padding of the timed
batches (positions that are not tokens or EOS, source and target together; --bucket-shapes pads more).
With --cuda-graphs (and --bucket-shapes) training is `nmt train --cuda-graphs`: the warm-up also trains one batch of
each shape of the timed and profiled updates, so every capture is paid there, and prints its time and captures.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nmt_cli.config import ARCHITECTURES, PreprocessConfig, SearchConfig, TrainConfig  # noqa: E402
from nmt_cli.data.batching import padding_stats  # noqa: E402
from nmt_cli.data.dataset import ParallelDataset  # noqa: E402
from nmt_cli.data.preprocess import file_checksums, preprocess  # noqa: E402
from nmt_cli.data.vocab import Vocab  # noqa: E402
from nmt_cli.runtime import choose_attention_backends  # noqa: E402
from nmt_cli.search.translate import SearchRequest, Translator, translate, translate_steps  # noqa: E402
from nmt_cli.train.epoch_plan import EpochPlan, plan_epoch  # noqa: E402

PEAK_BF16_TFLOPS = {
    "H100 SXM": 989.0,
    "H100 80GB HBM3": 989.0,
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
}
VOCAB = 37000
# --device cpu: sizes that run in a few seconds on 2 cores (a check that the script works, not a figure).
CPU_DEFAULTS = dict(
    archs="transformer_tiny",
    precision="fp32",
    max_tokens=512,
    updates=2,
    warmup=1,
    train_sentences=300,
    sentences=20,
    gen_arch="transformer_tiny",
    gen_max_tokens=512,
    vocab=1000,
)
GPU_DEFAULTS = dict(
    archs="transformer_base,transformer_big",
    precision="bf16",
    max_tokens=25000,
    updates=30,
    warmup=5,
    train_sentences=200_000,
    sentences=3000,
    gen_arch="transformer_base",
    gen_max_tokens=16000,
    vocab=VOCAB,
)


class SyntheticVocab(Vocab):
    """A data directory's sentencepiece model standing for a vocabulary of `n` pieces (random ids below n):
    search reads only its size."""

    def __init__(self, model_path: Path, n: int) -> None:
        super().__init__(model_path.read_bytes(), str(model_path))
        self.n = n

    @property
    def n_pieces(self) -> int:
        return self.n


def peak_tflops(name: str, override: float | None) -> float:
    if override:
        return override
    for key, value in sorted(PEAK_BF16_TFLOPS.items(), key=lambda kv: -len(kv[0])):
        if key.lower() in name.lower():
            return value
    raise SystemExit(f"no bf16 peak known for {name!r}; give --peak-tflops")


def news_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Piece counts shaped like WMT news sentences: log-normal, mean ~27, within 3..200."""
    return np.clip(rng.lognormal(3.15, 0.55, n), 3, 200).astype(np.int64)


def synthetic_data_dir(root: Path, n_train: int, vocab: int, seed: int = 1) -> Path:
    """A data directory in `nmt preprocess`'s layout with random ids below `vocab` (a tiny real one, rewritten:
    its token files, and in meta.json the vocabulary's size and the offsets files' checksums)."""
    text = root / "text"
    text.mkdir(parents=True)
    for lang in ("src", "tgt"):
        (text / f"train.{lang}").write_text("\n".join(f"{i} {i + 1} {i + 2}" for i in range(200)) + "\n")
    dest = root / "data-bin"
    preprocess(
        PreprocessConfig(
            source_lang="src", target_lang="tgt", trainpref=str(text / "train"), destdir=str(dest), vocab_size=40
        )
    )
    rng = np.random.default_rng(seed)
    src_lens = news_lengths(n_train, rng)
    tgt_lens = np.clip((src_lens * rng.normal(1.1, 0.1, n_train)).astype(np.int64), 2, 200)
    for lang, lens in (("src", src_lens), ("tgt", tgt_lens)):
        tokens = rng.integers(4, vocab, int(lens.sum())).astype(np.uint16)
        np.save(dest / f"train.{lang}.bin.npy", tokens)
        np.save(dest / f"train.{lang}.idx.npy", np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    meta = json.loads((dest / "meta.json").read_text())
    meta.update(vocab_size=vocab, n_pieces=vocab, dtype="uint16", checksums=file_checksums(dest))
    meta["splits"] = {"train": meta["splits"]["train"]}
    (dest / "meta.json").write_text(json.dumps(meta))
    return dest


def layer_params(model) -> tuple[int, int]:
    enc = sum(p.numel() for m in (model.encoder, model.encoder_norm) for p in m.parameters())
    dec = sum(p.numel() for m in (model.decoder, model.decoder_norm) for p in m.parameters())
    return enc, dec


def training_flops(model, cfg, s: np.ndarray, t: np.ndarray) -> float:
    """Model FLOPs of one update over sentences with source lengths s and target lengths t (EOS included)."""
    p_enc, p_dec = layer_params(model)
    d, le, ld = cfg.d_model, cfg.encoder_layers, cfg.decoder_layers
    s, t = s.astype(np.float64), t.astype(np.float64)
    dense = 6 * (p_enc * s.sum() + p_dec * t.sum() + d * cfg.vocab_size * t.sum())
    attention = 3 * 4 * d * (le * (s * s).sum() + ld * (s * t).sum()) + 3 * 2 * d * ld * (t * t).sum()
    return float(dense + attention)


def gpu_busy(trainer, plan: EpochPlan, batches: list[np.ndarray], first: int) -> float:
    """The share of the wall time of len(batches) updates (plan's from batch `first`) in which some kernel ran
    (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for i, ids in enumerate(batches):
            trainer.train_step([ids], plan)
            trainer.state.batch_in_epoch = first + i + 1
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    busy, end = 0.0, float("-inf")
    for a, b in spans:  # the union of the kernels' intervals
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy / wall_us


def benchmark_trainer(arch: str, data_dir: Path, save_dir: Path, max_tokens: int, device: str, precision: str, **extra):
    """The Trainer `nmt train` would build for `arch` on the synthetic data (profile_gpu.py builds it too);
    `extra`: further TrainConfig fields (cudnn_attention, bucket_shapes, compile)."""
    from nmt_cli.commands.train import prepare

    cfg = TrainConfig(
        data_dir=str(data_dir),
        save_dir=str(save_dir),
        max_tokens=max_tokens,
        max_update=10**6,
        device=device,
        precision=precision,
        warmup_updates=4000,
        threads=1 if device == "cpu" else 0,
        **extra,
    )
    return prepare(cfg, ARCHITECTURES[arch], SearchConfig())


def bench_training(arch: str, data_dir: Path, args, device: torch.device, peak: float) -> None:
    save = Path(tempfile.mkdtemp(prefix=f"bench-{arch}-"))  # the trainer's save directory: config.json only
    atexit.register(shutil.rmtree, save, ignore_errors=True)
    if device.type == "cuda":  # the peak over the whole run, warm-up included: --cuda-graphs' captures allocate
        # their graphs' memory there, which replays reuse without the allocator counting it again (a peak taken
        # after the warm-up said 2.2 GiB for base on the H200, against 7.6 without graphs)
        torch.cuda.reset_peak_memory_stats()
    trainer = benchmark_trainer(
        arch,
        data_dir,
        save,
        args.max_tokens,
        device.type,
        args.precision,
        cudnn_attention=args.cudnn_attention,
        bucket_shapes=args.bucket_shapes,
        cuda_graphs=args.cuda_graphs,
    )
    model_cfg = trainer.model_cfg
    data = trainer.train_data
    plan = plan_epoch(
        trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
    )
    batches = plan.batches
    n_warm = min(args.warmup, len(batches) - 1)
    warm = batches[:n_warm]
    if trainer.graphs is not None:  # every shape timed or profiled is captured in the warm-up, which is timed
        warm = with_every_shape(warm, batches[n_warm : n_warm + args.updates + args.busy_updates], trainer)
    start = time.perf_counter()
    for i, ids in enumerate(warm):
        trainer.train_step([ids], plan)
        trainer.state.batch_in_epoch = min(i + 1, n_warm)
    graphs: dict = {}
    if trainer.graphs is not None:
        torch.cuda.synchronize()
        graphs = dict(warmup_updates=len(warm), warmup_s=round(time.perf_counter() - start, 1))
        graphs["graphs"] = n_captures = trainer.graphs.n_captures
        print(
            f"train {arch:18s} {args.precision}: warm-up {len(warm)} updates in {graphs['warmup_s']} s, "
            f"{n_captures} batch shapes captured as CUDA graphs (--cuda-graphs)",
            flush=True,
        )
    if device.type == "cuda":
        torch.cuda.synchronize()
    n_tokens, flops, start = 0, 0.0, time.perf_counter()
    timed = batches[n_warm : n_warm + args.updates]
    for i, ids in enumerate(timed):
        stats = trainer.train_step([ids], plan)  # one host sync per update: the timing needs no other
        trainer.state.batch_in_epoch = n_warm + i + 1
        s, t = data.src_lens[ids] + 1, data.tgt_lens[ids] + 1
        n_tokens += int(t.sum())
        flops += training_flops(trainer.model, model_cfg, s, t)
        assert stats is not None
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak_gb = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    mfu = flops / seconds / (peak * 1e12)
    print(
        f"train {arch:18s} {args.precision}: {n_tokens / seconds:>10,.0f} target tok/s  "
        f"({n_tokens / len(timed):,.0f} target tokens/update, {len(timed)} updates, "
        f"{1000 * seconds / len(timed):.1f} ms/update)  MFU {mfu:6.1%}  peak memory {peak_gb:.1f} GiB",
        flush=True,
    )
    padding = padding_stats(timed, data.src_lens, data.tgt_lens, trainer.bucket_limit)
    first = n_warm + len(timed)
    profiled = batches[first : first + args.busy_updates]
    busy = gpu_busy(trainer, plan, profiled, first) if device.type == "cuda" and profiled else float("nan")
    why_not = "no CUDA" if device.type != "cuda" else "no update profiled"
    busy_text = f"{busy:.0%} of {len(profiled)} profiled updates" if busy == busy else f"not measured ({why_not})"
    print(
        f"train {arch:18s} {args.precision}: GPU busy {busy_text}; padding "
        f"{padding.padding():.1%} of the timed batches' positions in {len(padding.shapes)} shapes"
        f"{' (--bucket-shapes)' if args.bucket_shapes else ''}{' (--cuda-graphs)' if args.cuda_graphs else ''}",
        flush=True,
    )
    if trainer.graphs is not None:
        assert trainer.graphs.n_captures == n_captures, "a timed or profiled update captured a shape"
    record(
        args,
        what=f"train {arch}{' --cuda-graphs' if args.cuda_graphs else ''}",
        target_tok_s=round(n_tokens / seconds),
        ms_per_update=round(1000 * seconds / len(timed), 1),
        mfu=round(mfu, 4),
        peak_gib=round(peak_gb, 1),
        padding=round(padding.padding(), 4),
        gpu_busy=None if busy != busy else round(busy, 3),
        **graphs,
    )
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()


def with_every_shape(warm: list[np.ndarray], later: list[np.ndarray], trainer) -> list[np.ndarray]:
    """`warm` and the first batch of each shape of `later` that `warm` lacks (shapes as `collate` pads them)."""
    data = trainer.train_data

    def shape(ids: np.ndarray) -> tuple[int, int, int]:
        return padding_stats([ids], data.src_lens, data.tgt_lens, trainer.bucket_limit).shapes.pop()

    seen = {shape(ids) for ids in warm}
    extra = []
    for ids in later:
        if shape(ids) not in seen:
            seen.add(shape(ids))
            extra.append(ids)
    return warm + extra


GEN_BATCHINGS = ("budget", "batch 32")  # --gen-max-tokens source tokens a batch, or batches of 32 sentences
GEN_SEARCHES = ("default", "slots", "graphs")  # beam.py's search; fixed slots eager; fixed slots, captured steps


def generation_model(arch: str, vocab: int, device: torch.device):
    """The generation model: `arch` with `vocab` pieces and random weights (seed 1), for inference."""
    from nmt_cli.model.transformer import build_model

    torch.manual_seed(1)
    return build_model(replace(ARCHITECTURES[arch], vocab_size=vocab)).to(device).eval()


def news_sources(n: int, vocab: int) -> list[np.ndarray]:
    """The generation sources: n news-length sentences of random ids below `vocab` (seed 2)."""
    rng = np.random.default_rng(2)
    return [rng.integers(4, vocab, k) for k in news_lengths(n, rng)]


def bench_generation(args, data_dir: Path, device: torch.device, peak: float) -> None:
    """Beam 4 over --sentences sentences, for each batching and search of --gen-batchings and --gen-searches; each
    row also counts the sentences whose best translation differs from the default search's at that batching."""
    from nmt_cli.search.slots import slot_search_for

    model_cfg = replace(ARCHITECTURES[args.gen_arch], vocab_size=args.vocab)
    model = generation_model(args.gen_arch, args.vocab, device)
    sources = news_sources(args.sentences, args.vocab)
    lens = np.array([len(s) for s in sources])
    cfg = SearchConfig(beam=4, max_len_a=1.1, max_len_b=0, min_len=0)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    vocab = SyntheticVocab(data_dir / "spm.model", args.vocab)
    for batching in args.gen_batchings.split(","):
        max_tokens, batch_size = (args.gen_max_tokens, 0) if batching == "budget" else (10**9, 32)
        default = None
        for search in args.gen_searches.split(","):
            if search == "graphs" and device.type != "cuda":
                print(f"generate {batching} {search}: skipped (CUDA graphs need CUDA)", flush=True)
                continue
            slots = None if search == "default" else slot_search_for(True, search == "graphs", device)
            translator = Translator(model, vocab, device, amp, slots=slots)
            translate(
                translator, SearchRequest(sources[:200], cfg, max_tokens, batch_size)
            )  # warm-up (and first captures)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            results, n_steps = translate_counting_steps(translator, sources, cfg, max_tokens, batch_size)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            best = [h[0].tokens for h in results]
            default = best if search == "default" else default
            differ = None if default is None else sum(a != b for a, b in zip(best, default))
            what = f"generate {args.gen_arch} beam 4"
            if (batching, search) != ("budget", "default"):
                what += f", {batching}, {search}"
            report_generation(args, what, model, model_cfg, lens, results, seconds, peak, differ, n_steps)
            del translator


def translate_counting_steps(translator, sources, cfg, max_tokens, batch_size):
    """translate(), and the decoder steps it ran (translate_steps yields once a step)."""
    steps, n_steps = translate_steps(translator, SearchRequest(sources, cfg, max_tokens, batch_size)), 0
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value, n_steps
        n_steps += 1


def report_generation(args, what, model, model_cfg, lens, results, seconds, peak, differ, n_steps) -> None:
    """Print and record one generation row: sentences, seconds, target tokens/s, MFU and the wall time per decoder
    step (the host's time per step where the host is the bottleneck, as on the GPU before CUDA graphs)."""
    out = np.array([len(h[0].tokens) + 1 for h in results], dtype=np.float64)
    s = lens.astype(np.float64) + 1
    p_enc, p_dec = layer_params(model)
    d, ld = model_cfg.d_model, model_cfg.decoder_layers
    # Forward FLOPs: the encoder once per sentence, the decoder and projection for K beams per output token.
    flops = (
        2 * p_enc * s.sum()
        + 4 * 2 * (p_dec + d * args.vocab) * out.sum()
        + 2 * 4 * d * model_cfg.encoder_layers * (s * s).sum()
        + 4 * 4 * d * ld * (s * out).sum()
        + 4 * 2 * d * ld * (out * out).sum()
    )
    mfu = flops / seconds / (peak * 1e12)
    print(
        f"{what} {args.precision}: {len(results):,} sentences in {seconds:.2f} s = "
        f"{len(results) / seconds:,.0f} sentences/s, {out.sum() / seconds:,.0f} tokens/s  MFU {mfu:6.2%}  "
        f"{n_steps} steps, {1000 * seconds / n_steps:.2f} ms/step"
        + ("" if differ is None else f"  {differ} best translations differ from the default search's"),
        flush=True,
    )
    record(
        args,
        what=what,
        sentences=len(results),
        seconds=round(seconds, 2),
        tokens_s=round(out.sum() / seconds),
        mfu=round(mfu, 5),
        ms_per_step=round(1000 * seconds / n_steps, 3),
        **({} if differ is None else {"differ": differ}),
    )


def record(args, **figures) -> None:
    """Append one figure to --results as a JSON line (gpu_check.sh builds its table from them)."""
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps({**figures, "precision": args.precision, "device": args.device_name}) + "\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, if not in the table")
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: tiny sizes, only checks that the script runs"
    )
    parser.add_argument("--archs", help=f"[default: {GPU_DEFAULTS['archs']}; cpu: {CPU_DEFAULTS['archs']}]")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), help="[default: bf16; cpu: fp32]")
    parser.add_argument("--max-tokens", type=int, help="per update (one batch) [default: 25000]")
    parser.add_argument("--updates", type=int, help="timed updates [default: 30]")
    parser.add_argument("--warmup", type=int, help="untimed updates first [default: 5]")
    parser.add_argument("--train-sentences", type=int, help="[default: 200000]")
    parser.add_argument("--sentences", type=int, help="translated [default: 3000]")
    parser.add_argument("--gen-arch", help="[default: transformer_base]")
    parser.add_argument("--gen-max-tokens", type=int, help="source tokens per search batch [default: 16000]")
    parser.add_argument("--vocab", type=int, help=f"pieces [default: {VOCAB}]")
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--skip-training", action="store_true", help="generation only")
    parser.add_argument(
        "--gen-batchings", default=",".join(GEN_BATCHINGS), help="budget: --gen-max-tokens a batch; batch 32"
    )
    parser.add_argument(
        "--gen-searches",
        default=",".join(GEN_SEARCHES),
        help="default: beam.py's search; slots: fixed slots, eager; graphs: fixed slots, captured CUDA graphs",
    )
    parser.add_argument("--cudnn-attention", action="store_true", help="let attention use cuDNN (as before issue 33)")
    parser.add_argument("--results", help="append each figure to this file as a JSON line")
    parser.add_argument("--busy-updates", type=int, default=3, help="updates profiled for GPU busy %% (0: none)")
    parser.add_argument("--bucket-shapes", action="store_true", help="train with `nmt train --bucket-shapes`")
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="train with `nmt train --cuda-graphs` (needs --bucket-shapes; the warm-up then captures every shape)",
    )
    args = parser.parse_args()
    if args.cuda_graphs and not args.bucket_shapes:
        parser.error("--cuda-graphs needs --bucket-shapes, as `nmt train --cuda-graphs` does")
    if args.cuda_graphs and args.device != "cuda":
        parser.error("--cuda-graphs captures CUDA graphs: it needs --device cuda")
    for key, value in (CPU_DEFAULTS if args.device == "cpu" else GPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; skipped")
        return
    device = torch.device(args.device)
    args.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(args.device_name, args.peak_tflops) if device.type == "cuda" else (args.peak_tflops or 1.0)
    print(
        f"device: {args.device_name}  (dense bf16 peak {peak:g} TFLOP/s for MFU)  torch {torch.__version__}",
        flush=True,
    )
    choose_attention_backends(device, args.cudnn_attention)  # as nmt train and nmt generate start
    if device.type == "cpu":
        torch.set_num_threads(1)  # the check's tiny products: more threads only wait on each other
    print(__doc__[__doc__.index("Model FLOPs") : __doc__.index("Also per architecture")].rstrip(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        data_dir = synthetic_data_dir(Path(tmp), args.train_sentences, args.vocab)
        assert len(ParallelDataset(data_dir, "train")) == args.train_sentences
        for arch in [] if args.skip_training else args.archs.split(","):
            bench_training(arch, data_dir, args, device, peak)
        if not args.skip_generation:
            bench_generation(args, data_dir, device, peak)


if __name__ == "__main__":
    main()
