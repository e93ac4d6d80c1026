"""Where a CPU training step's time goes, and how long oneDNN's kernel warm-up lasts.

For each shape and precision: the time of every update from the first (oneDNN JIT-compiles a kernel for
each new matmul shape, so early updates are slow), then a profile of steady updates, with the operators'
own time grouped into matmul, attention, layer norm, softmax, dropout, copies, element-wise, optimizer
and other, and the rest of the wall clock (Python and the framework between operators). The FLOPs of a
step are counted from the shapes (formula in `step_work`), and the same products timed in isolation
(`matmul_peak`) give the machine's matmul limit for that work, so the speed reads as a fraction of it.

    python benchmarks/profile_step.py --shapes small,base --precisions fp32,bf16 --warmup 40 --steps 10
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import data_bin, precisions, report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nmt_cli.commands.train import prepare  # noqa: E402
from nmt_cli.config import ModelConfig, SearchConfig, TrainConfig, model_config  # noqa: E402
from nmt_cli.data.batching import collate  # noqa: E402
from nmt_cli.model.linear import Linear  # noqa: E402
from nmt_cli.runtime import AMP_DTYPES, autocast  # noqa: E402
from nmt_cli.train.epoch_plan import plan_epoch  # noqa: E402
from nmt_cli.train.trainer import Trainer  # noqa: E402

GROUPS = (  # the first group whose key is in the operator's name takes it
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention")),
    ("matmul", ("linear", "addmm", "matmul", "bmm", "mm", "mkldnn", "_convolution")),
    ("layer norm", ("layer_norm",)),
    ("softmax", ("softmax",)),
    ("dropout", ("dropout", "bernoulli", "rand", "uniform")),
    ("optimizer", ("_foreach", "adam", "_fused")),
    (
        "copies",
        (
            "copy",
            "_to_",
            "to_dense",
            "contiguous",
            "cat",
            "index",
            "clone",
            "pad",
            "gather",
            "scatter",
            "narrow",
            "slice",
            "stack",
            "embedding",
        ),
    ),
    (
        "element-wise",
        (
            "add",
            "mul",
            "sub",
            "div",
            "relu",
            "exp",
            "log",
            "where",
            "fill",
            "sum",
            "mean",
            "max",
            "masked",
            "neg",
            "sqrt",
            "pow",
            "lt",
            "gt",
            "eq",
            "ne",
            "clamp",
            "amax",
            "zero",
        ),
    ),
)


def group_of(name: str, groups: tuple[tuple[str, tuple[str, ...]], ...] = GROUPS) -> str:
    """The first of `groups` with a key in the operator's name, or "other"."""
    name = name.lower()
    return next((g for g, keys in groups if any(k in name for k in keys)), "other")


def linear_shapes(cfg: ModelConfig) -> tuple[collections.Counter, collections.Counter]:
    """(in, out) of every weight a token passes through, with counts: the encoder's (per source token) and
    the decoder's with the output projection (per target token). Shared by the FLOP count and the limit."""
    d, f = cfg.d_model, cfg.d_ff
    layer = collections.Counter({(d, 3 * d): 1, (d, d): 1, (d, f): 1, (f, d): 1})  # QKV, out, FFN
    cross = collections.Counter({(d, d): 2, (d, 2 * d): 1})  # query, out; keys and values
    encoder = collections.Counter({shape: n * cfg.encoder_layers for shape, n in layer.items()})
    decoder = collections.Counter({shape: n * cfg.decoder_layers for shape, n in (layer + cross).items()})
    decoder[(d, cfg.vocab_size)] += 1
    return encoder, decoder


def step_work(trainer: Trainer, group: list[np.ndarray]) -> tuple[float, int]:
    """Matmul FLOPs of one update and its target tokens. FLOPs: 6 per multiply-add-weight per token (forward
    2, backward 4), over the encoder's linears for source tokens, the decoder's and the output projection's
    for target tokens, plus attention's QK^T and AV products (4 * S * S' * D per layer and sentence, times 3
    for backward)."""
    cfg = trainer.model_cfg
    encoder, decoder = linear_shapes(cfg)
    enc_w = sum(n * k * m for (k, m), n in encoder.items())
    dec_w = sum(n * k * m for (k, m), n in decoder.items())
    total, tokens = 0.0, 0
    for ids in group:
        batch = collate(trainer.train_data, ids)
        s, t = batch.src_tokens.shape[1], batch.tgt_in.shape[1]
        n_src, n_tgt = int((~batch.src_pad_mask).sum()), batch.n_tgt_tokens
        attn = len(ids) * 4 * cfg.d_model * (cfg.encoder_layers * s * s + cfg.decoder_layers * (t * t + t * s))
        total += 6 * (enc_w * n_src + dec_w * n_tgt) + 3 * attn
        tokens += n_tgt
    return total, tokens


def matmul_peak(trainer: Trainer, rows: int, precision: str, repeat: int = 5) -> float:
    """GFLOP/s of the shape's own linear products in isolation: forward and both gradients of an nmt
    `Linear` (the route training takes on this CPU) for each of the step's weight shapes on `rows` tokens,
    weighted as `step_work` counts them. The machine's limit for this step's matmul work."""
    encoder, decoder = linear_shapes(trainer.model_cfg)
    flops, seconds = 0.0, 0.0
    with autocast(torch.device("cpu"), AMP_DTYPES[precision]):
        for (k, n), count in (encoder + decoder).items():
            layer = Linear(k, n)
            x = torch.randn(rows, k, requires_grad=True)
            for i in range(repeat + 2):
                x.grad, layer.weight.grad, layer.bias.grad = None, None, None  # as each update starts
                start = time.perf_counter()
                layer(x).float().sum().backward()
                if i >= 2:
                    seconds += count * (time.perf_counter() - start)
            flops += count * repeat * 6.0 * rows * k * n
    return flops / seconds / 1e9


def build(shape: str, precision: str, work: Path) -> Trainer:
    cfg = TrainConfig(
        data_dir=str(data_bin()),
        save_dir=str(work / f"{shape}-{precision}"),
        max_update=10**6,
        max_tokens=4096,
        threads=2,
        device="cpu",
        precision=precision,
        log_interval=10**6,
    )
    Path(cfg.save_dir).mkdir(parents=True)
    return prepare(cfg, model_config(f"transformer_{shape}"), SearchConfig())


def profile(shape: str, precision: str, warmup: int, steps: int, work: Path) -> dict[str, object]:
    trainer = build(shape, precision, work)
    batches = plan_epoch(
        trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
    ).batches
    times = []
    for i in range(warmup):
        start = time.perf_counter()
        trainer.train_step([batches[i % len(batches)]])
        times.append(time.perf_counter() - start)
    steady = float(np.median(times[-10:]))
    settled = next(i for i, t in enumerate(times) if t <= 1.15 * steady)
    groups: dict[str, float] = collections.defaultdict(float)
    flops, wall, tokens = 0.0, 0.0, 0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(warmup, warmup + steps):
            group = [batches[i % len(batches)]]
            start = time.perf_counter()
            trainer.train_step(group)
            wall += time.perf_counter() - start
            step_flops, step_tokens = step_work(trainer, group)
            flops, tokens = flops + step_flops, tokens + step_tokens
    for event in prof.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e6
    in_ops = sum(groups.values())
    row: dict[str, object] = {
        "shape": shape,
        "precision": precision,
        "first update s": round(times[0], 2),
        "steady update s": round(steady, 3),
        "updates to steady": settled,
        "GFLOP/s": round(flops / wall / 1e9, 1),
    }
    peak = matmul_peak(trainer, tokens // steps, precision)
    row["matmul peak GFLOP/s"] = round(peak, 1)
    row["of peak"] = f"{100 * flops / wall / 1e9 / peak:.0f}%"
    for name, _ in GROUPS:
        row[name] = f"{100 * groups[name] / wall:.0f}%"
    row["other ops"] = f"{100 * groups['other'] / wall:.0f}%"
    row["outside ops"] = f"{100 * max(wall - in_ops, 0.0) / wall:.0f}%"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--precisions", help="comma-separated [default: fp32,bf16; fp32 on CPUs without bf16]")
    parser.add_argument("--warmup", type=int, default=40, help="Timed updates before the profile.")
    parser.add_argument("--steps", type=int, default=10, help="Profiled updates.")
    args = parser.parse_args()
    torch.set_num_threads(2)
    chosen = precisions(args.precisions)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            for precision in chosen:
                rows.append(profile(shape, precision, args.warmup, args.steps, Path(tmp)))
    report("profile_step", rows)
    if not math.isfinite(sum(float(r["GFLOP/s"]) for r in rows)):  # type: ignore[arg-type]
        raise SystemExit("a profile produced no finite speed")


if __name__ == "__main__":
    main()
