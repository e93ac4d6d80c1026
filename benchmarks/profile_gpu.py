"""Where a GPU training update's time goes: GPU busy %, the costliest kernels, and the host time of the top ops.

    python benchmarks/profile_gpu.py [--arch transformer_base] [--updates 3] [--results FILE]
    python benchmarks/profile_gpu.py --compile-warmup      # instead: how long --compile's first updates take
    python benchmarks/profile_gpu.py --device cpu          # tiny sizes: checks that the script runs

The real Trainer (as bench_gpu.py runs it, on its synthetic news-like data) makes `--warmup` updates, then
`torch.profiler` records `--updates` more. GPU busy is the time some kernel ran (the union of the kernels'
intervals, so overlapping streams count once) over the profiled wall clock: a GPU waiting for the host shows
as a low figure, and host-heavy ops (issue 33: cuDNN attention planning each new shape, 350 ms of host time an
update) top the host table. --results appends the figures as one JSON line (gpu_check.sh's table).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from bench_gpu import benchmark_trainer, synthetic_data_dir

from nmt_cli.train.epoch_plan import EpochPlan, plan_epoch
from nmt_cli.train.trainer import Trainer


def build(args: argparse.Namespace, data_dir: Path, save_dir: Path) -> Trainer:
    return benchmark_trainer(
        args.arch, data_dir, save_dir, args.max_tokens, args.device, args.precision, compile=args.compile_warmup
    )


def run_updates(trainer: Trainer, plan: EpochPlan, first: int, n: int) -> float:
    """n updates from the plan's batch `first`; returns their wall clock (the device finished)."""
    start = time.perf_counter()
    for i in range(first, first + n):
        trainer.train_step([plan.batches[i % len(plan.batches)]], plan)
        trainer.state.batch_in_epoch = i + 1
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def profile(trainer: Trainer, plan: EpochPlan, first: int, n: int) -> dict:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if trainer.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        wall = run_updates(trainer, plan, first, n)
    kernels: dict[str, float] = defaultdict(float)
    intervals = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.time_range.elapsed_us() / 1e3
            intervals.append((e.time_range.start, e.time_range.end))
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    return {
        "wall_ms_per_update": round(1e3 * wall / n, 1),
        "gpu_busy": round(busy_seconds(intervals) / 1e6 / wall, 3) if intervals else None,
        "kernels_ms": sorted(((round(ms / n, 2), name) for name, ms in kernels.items()), reverse=True)[:10],
        "host_ops_ms": [(round(e.self_cpu_time_total / 1e3 / n, 2), e.key, e.count // n) for e in ops],
    }


def show(arch: str, figures: dict) -> None:
    busy = "n/a (no CUDA kernels)" if figures["gpu_busy"] is None else f"{figures['gpu_busy']:.0%}"
    print(f"{arch}: {figures['wall_ms_per_update']} ms/update, GPU busy {busy}")
    print("costliest kernels (ms per update):")
    for ms, name in figures["kernels_ms"]:
        print(f"  {ms:9.2f}  {name[:110]}")
    print("host time of the top ops (self CPU ms per update, calls per update):")
    for ms, name, calls in figures["host_ops_ms"]:
        print(f"  {ms:9.2f}  {name[:90]}  x{calls}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--arch", help="[default: transformer_base; cpu: transformer_tiny]")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), help="[default: bf16; cpu: fp32]")
    parser.add_argument("--max-tokens", type=int, help="per update [default: 25000; cpu: 512]")
    parser.add_argument("--warmup", type=int, default=8, help="updates before the profile")
    parser.add_argument("--updates", type=int, default=3, help="profiled updates")
    parser.add_argument("--compile-warmup", action="store_true", help="time --compile's warm-up instead")
    parser.add_argument("--results", help="append the figures to this file as a JSON line")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.arch = args.arch or ("transformer_tiny" if cpu else "transformer_base")
    args.precision = args.precision or ("fp32" if cpu else "bf16")
    args.max_tokens = args.max_tokens or (512 if cpu else 25000)
    if not cpu and not torch.cuda.is_available():
        print("profile_gpu: no CUDA device; skipped")
        return
    if cpu:
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="profile-gpu-") as tmp:
        data_dir = synthetic_data_dir(Path(tmp), 300 if cpu else 20_000, 1000 if cpu else 37000)
        (Path(tmp) / "save").mkdir()
        trainer = build(args, data_dir, Path(tmp) / "save")
        plan = plan_epoch(
            trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
        )
        warm = run_updates(trainer, plan, 0, args.warmup)
        if args.compile_warmup:
            steady = run_updates(trainer, plan, args.warmup, args.updates)
            figures = {"warmup_s": round(warm, 1), "steady_ms_per_update": round(1e3 * steady / args.updates, 1)}
            print(f"{args.arch} --compile: {args.warmup} warm-up updates {warm:.1f} s, then {figures} ")
            what = f"compile {args.arch}"
        else:
            figures = profile(trainer, plan, args.warmup, args.updates)
            show(args.arch, figures)
            what = f"profile {args.arch}"
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps({"what": what, "precision": args.precision, **figures}) + "\n")


if __name__ == "__main__":
    main()
