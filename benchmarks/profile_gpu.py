"""Where a GPU training update's time goes, or a beam-search step's: GPU busy %, the costliest kernels, the host
time of the top ops (and, for a search step, its kernel launches).

    python benchmarks/profile_gpu.py [--arch transformer_base] [--updates 3] [--results FILE]
    python benchmarks/profile_gpu.py --compile-warmup      # instead: how long --compile's first updates take
    python benchmarks/profile_gpu.py --generation          # instead: a beam-search step, per batching and search
    python benchmarks/profile_gpu.py --device cpu          # tiny sizes: checks that the script runs
    python benchmarks/profile_gpu.py --bucket-shapes --cuda-graphs   # an update of `nmt train` with those options

The real Trainer (as bench_gpu.py runs it, on its synthetic news-like data) makes `--warmup` updates, then
`torch.profiler` records `--updates` more. GPU busy is the time some kernel ran (the union of the kernels'
intervals, so overlapping streams count once) over the profiled wall clock: a GPU waiting for the host shows
as a low figure, and host-heavy ops (issue 33: cuDNN attention planning each new shape, 350 ms of host time an
update) top the host table. --results appends the figures as one JSON line (gpu_check.sh's table). With
--cuda-graphs the profiled updates' batch shapes are captured before the profile, as `nmt train`'s first updates
of each shape would.

--generation: bench_gpu.py's generation (a transformer_base with random weights, beam 4, outputs forced to 1.1 x
the source length, bf16 on CUDA, its --sentences news-length sources drawn alike) for each of its batchings
(budget: --max-tokens source tokens a batch; batch 32) and searches (default; slots: fixed slots, eager;
graphs: fixed slots with captured CUDA graphs, CUDA only). Of each batching, one batch is searched: the middle one
of those translate makes of the sources, in length order. Each search runs it once whole (the warm-up: first
kernels, graph captures), then twice more up to the end of `--steps` decoder steps in its middle: timed alone
(ms/step), then under torch.profiler (GPU busy %, the kernels' and the host ops' time per step, kernel launches
per step: a captured step is one graph launch, so those are counted apart, and the kernels the GPU ran, graphs'
included). The profiler slows the host, so busy % is of the slower, profiled steps; the ms of kernels per step
reads against the unprofiled ms/step. --results appends one JSON line per batching and search.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from bench_gpu import (
    CPU_DEFAULTS,
    GEN_BATCHINGS,
    GEN_SEARCHES,
    GPU_DEFAULTS,
    SyntheticVocab,
    benchmark_trainer,
    generation_model,
    news_sources,
    synthetic_data_dir,
    translate_counting_steps,
    with_every_shape,
)

from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import batch_by_tokens
from nmt_cli.runtime import AMP_DTYPES, choose_attention_backends
from nmt_cli.search.slots import slot_search_for
from nmt_cli.search.translate import SearchRequest, Translator, translate_steps
from nmt_cli.train.epoch_plan import EpochPlan, plan_epoch
from nmt_cli.train.trainer import Trainer


def build(args: argparse.Namespace, data_dir: Path, save_dir: Path) -> Trainer:
    return benchmark_trainer(
        args.arch,
        data_dir,
        save_dir,
        args.max_tokens,
        args.device,
        args.precision,
        compile=args.compile_warmup,
        bucket_shapes=args.bucket_shapes,
        cuda_graphs=args.cuda_graphs,
    )


def options(args: argparse.Namespace) -> str:
    """The training options profiled, as `nmt train` spells them ("" for none)."""
    return "".join(f" --{name}" for name in ("bucket-shapes", "cuda-graphs") if getattr(args, name.replace("-", "_")))


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


def profiler_for(device: torch.device) -> torch.profiler.profile:
    """A torch.profiler recording the host's ops, and on CUDA the device's kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def tables(prof: torch.profiler.profile, n: int) -> tuple[list[tuple[float, str]], list[tuple[float, str, int]]]:
    """The 10 costliest device kernels (ms per unit of n: update or step) and the 10 host ops of the most self CPU
    time (ms and calls per unit) of a profile of n units."""
    kernels: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.time_range.elapsed_us() / 1e3
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    return (
        sorted(((round(ms / n, 3), name) for name, ms in kernels.items()), reverse=True)[:10],
        [(round(e.self_cpu_time_total / 1e3 / n, 3), e.key, round(e.count / n, 1)) for e in ops],
    )


def device_intervals(prof: torch.profiler.profile) -> list[tuple[float, float]]:
    """The (start, end) microseconds of everything the device ran (kernels, copies) in a profile."""
    return [
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    ]


def profile(trainer: Trainer, plan: EpochPlan, first: int, n: int) -> dict:
    with profiler_for(trainer.device) as prof:
        wall = run_updates(trainer, plan, first, n)
    intervals = device_intervals(prof)
    kernels_ms, host_ops_ms = tables(prof, n)
    return {
        "wall_ms_per_update": round(1e3 * wall / n, 1),
        "gpu_busy": round(busy_seconds(intervals) / 1e6 / wall, 3) if intervals else None,
        "kernels_ms": kernels_ms,
        "host_ops_ms": host_ops_ms,
    }


def show(arch: str, figures: dict) -> None:
    busy = "n/a (no CUDA kernels)" if figures["gpu_busy"] is None else f"{figures['gpu_busy']:.0%}"
    print(f"{arch}: {figures['wall_ms_per_update']} ms/update, GPU busy {busy}")
    show_tables(figures, "update")


def show_tables(figures: dict, unit: str) -> None:
    """The kernels' and the host ops' tables of `figures`, per `unit` (update, step)."""
    print(f"costliest kernels (ms per {unit}):")
    for ms, name in figures["kernels_ms"]:
        print(f"  {ms:9.3f}  {name[:110]}")
    if not figures["kernels_ms"]:
        print("  none: no CUDA kernels were recorded")
    print(f"host time of the top ops (self CPU ms per {unit}, calls per {unit}):")
    for ms, name, calls in figures["host_ops_ms"]:
        print(f"  {ms:9.3f}  {name[:90]}  x{calls}")


def middle_batch(sources: list[np.ndarray], max_tokens: int, batch_size: int) -> tuple[list[np.ndarray], str]:
    """The middle one, in length order, of the batches translate_steps makes of `sources` (token budget
    `max_tokens`, at most `batch_size` sentences, 0: no cap), and a line saying which it is."""
    lengths = np.array([len(s) for s in sources], dtype=np.int64)
    budget = max(max_tokens, int(lengths.max()) + 1)  # translate_steps' own: every sentence fits
    batches, _ = batch_by_tokens(lengths, lengths, budget, None, batch_size)
    middle = len(batches) // 2
    ids = batches[middle]
    alone = max(max_tokens, int(lengths[ids].max()) + 1)
    assert len(batch_by_tokens(lengths[ids], lengths[ids], alone, None, batch_size)[0]) == 1, "translated as one"
    which = f"batch {middle + 1} of {len(batches)}, {len(ids)} sentences of {lengths[ids].min()}-{lengths[ids].max()}"
    return [sources[i] for i in ids], which + " pieces"


def step_window(n_encoder_layers: int, n_resumptions: int, n_steps: int) -> tuple[int, int]:
    """The resumptions (first, n) of a batch's translate_steps to profile: n_steps decoder steps (fewer where the
    batch has fewer) in the middle of its search. The first n_encoder_layers resumptions run the encoder, a
    layer each; resumption n_encoder_layers + i runs decoder step i (step 0 also sets the search up: left out)."""
    first = max(n_encoder_layers + 1, (n_encoder_layers + n_resumptions - n_steps) // 2)
    n = min(n_steps, n_resumptions - first)
    if n < 1:
        raise SystemExit(f"profile_gpu: the batch has {n_resumptions - n_encoder_layers} decoder steps, too few")
    return first, n


def run_window(
    translator: Translator,
    batch: list[np.ndarray],
    cfg: SearchConfig,
    sizes: tuple[int, int],
    first: int,
    n: int,
    prof: torch.profiler.profile | None = None,
) -> float:
    """Translate `batch` (one batch of `sizes`: max_tokens, batch_size) up to resumption first + n; the wall seconds
    of the last n, the device finished, recorded by `prof` where given. The rest of the batch is not searched."""
    steps = translate_steps(translator, SearchRequest(batch, cfg, *sizes))
    for _ in range(first):
        next(steps)
    synchronize(translator.device)
    with prof if prof is not None else contextlib.nullcontext():
        start = time.perf_counter()
        for _ in range(n):
            next(steps)
        synchronize(translator.device)
        wall = time.perf_counter() - start
    steps.close()
    return wall


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def launch_counts(prof: torch.profiler.profile) -> tuple[int, int, int]:
    """Kernel launches and graph launches (one replays a whole captured step) the host made, and the kernels the
    device ran (those of the graphs included; copies and memsets not), in a profile."""
    kernel_launches = graph_launches = kernels = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += not e.name.startswith(("Memcpy", "Memset"))
            continue
        api = re.sub(r"_v\d+$", "", e.name)  # a CUDA API's name, without the version suffix CUPTI may add
        if api in ("cudaGraphLaunch", "cuGraphLaunch"):
            graph_launches += 1
        elif api.startswith(
            ("cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cuLaunchKernel", "cuLaunchCooperative")
        ):
            kernel_launches += 1
    return kernel_launches, graph_launches, kernels


def profile_search(
    translator: Translator, batch: list[np.ndarray], cfg: SearchConfig, sizes: tuple[int, int], n_steps: int
) -> dict:
    """The figures of n_steps decoder steps in the middle of searching `batch`, after one whole search of it (the
    warm-up: first kernels, graph captures): ms/step timed alone, and under the profiler GPU busy, the kernels'
    ms/step, kernel and graph launches and kernels run per step, and the kernels' and host ops' tables."""
    _, n_resumptions = translate_counting_steps(translator, batch, cfg, *sizes)  # the warm-up
    n_enc = len(translator.model.encoder)
    first, n = step_window(n_enc, n_resumptions, n_steps)
    wall = run_window(translator, batch, cfg, sizes, first, n)
    prof = profiler_for(translator.device)
    profiled = run_window(translator, batch, cfg, sizes, first, n, prof)
    launches, graph_launches, kernels = launch_counts(prof)
    busy = busy_seconds(device_intervals(prof)) / 1e6 if kernels else None  # None: no kernel was traced
    on_cuda = translator.device.type == "cuda"
    kernels_ms, host_ops_ms = tables(prof, n)
    return {
        "decoder_steps": n_resumptions - n_enc + 1,
        "profiled_steps": [first - n_enc, first - n_enc + n - 1],
        "ms_per_step": round(1e3 * wall / n, 3),
        "profiled_ms_per_step": round(1e3 * profiled / n, 3),
        "gpu_busy": None if busy is None else round(busy / profiled, 3),
        "kernel_ms_per_step": None if busy is None else round(1e3 * busy / n, 3),
        "launches_per_step": round(launches / n, 1) if on_cuda else None,
        "graph_launches_per_step": round(graph_launches / n, 1) if on_cuda else None,
        "kernels_per_step": round(kernels / n, 1) if on_cuda else None,
        "host_ops_ms_per_step": round(sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e3 / n, 3),
        "kernels_ms": kernels_ms,
        "host_ops_ms": host_ops_ms,
    }


def show_search(what: str, which: str, figures: dict) -> None:
    a, b = figures["profiled_steps"]
    print(f"{what}: {which}, {figures['decoder_steps']} decoder steps; steps {a}-{b} profiled")
    if figures["launches_per_step"] is None:
        gpu = "GPU busy n/a, kernel launches n/a (no CUDA)"
    else:
        busy = "n/a (no kernel traced)"
        if figures["gpu_busy"] is not None:
            busy = f"{figures['gpu_busy']:.0%} ({figures['kernel_ms_per_step']} ms/step of kernels)"
        gpu = (
            f"GPU busy {busy}; per step {figures['launches_per_step']} kernel launches, "
            f"{figures['graph_launches_per_step']} graph launches, {figures['kernels_per_step']} kernels run"
        )
    print(
        f"  {figures['ms_per_step']} ms/step ({figures['profiled_ms_per_step']} under the profiler, "
        f"{figures['host_ops_ms_per_step']} of it host time in ops); {gpu}"
    )
    show_tables(figures, "step")


def profile_generation(args: argparse.Namespace) -> None:
    """bench_gpu.py's generation, a batch of each batching profiled with each search (the module's docstring)."""
    device = torch.device(args.device)
    choose_attention_backends(device, False)  # as nmt generate starts
    model = generation_model(args.arch, args.vocab, device)
    sources = news_sources(args.sentences, args.vocab)
    cfg = SearchConfig(beam=4, max_len_a=1.1, max_len_b=0, min_len=0)
    with tempfile.TemporaryDirectory(prefix="profile-gpu-") as tmp:  # the vocabulary reads its model file once
        vocab = SyntheticVocab(synthetic_data_dir(Path(tmp), 10, args.vocab) / "spm.model", args.vocab)
    with profiler_for(device):  # the profiler's first start (CUPTI's set-up) stays out of the first search's figures
        synchronize(device)
    for batching in GEN_BATCHINGS:
        sizes = (args.max_tokens, 0) if batching == "budget" else (10**9, 32)
        batch, which = middle_batch(sources, *sizes)
        for search in GEN_SEARCHES:
            what = f"generate {args.arch} beam 4, {batching}, {search}"
            if search == "graphs" and device.type != "cuda":
                print(f"{what}: skipped (CUDA graphs need CUDA)", flush=True)
                continue
            slots = None if search == "default" else slot_search_for(True, search == "graphs", device)
            translator = Translator(model, vocab, device, AMP_DTYPES[args.precision], slots=slots)
            figures = profile_search(translator, batch, cfg, sizes, args.steps)
            show_search(f"{what} ({args.precision})", which, figures)
            print(flush=True)
            record(args, f"profile {what}", figures)


def record(args: argparse.Namespace, what: str, figures: dict) -> None:
    """Append `figures` to --results as one JSON line (gpu_check.sh's table)."""
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps({"what": what, "precision": args.precision, **figures}) + "\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--arch", help="[default: transformer_base; cpu: transformer_tiny]")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), help="[default: bf16; cpu: fp32]")
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="per update [default: 25000; cpu: 512]; --generation: source tokens per batch "
        f"at the budget [default: {GPU_DEFAULTS['gen_max_tokens']}; cpu: {CPU_DEFAULTS['gen_max_tokens']}]",
    )
    parser.add_argument("--warmup", type=int, default=8, help="updates before the profile")
    parser.add_argument("--updates", type=int, default=3, help="profiled updates")
    parser.add_argument("--bucket-shapes", action="store_true", help="train with `nmt train --bucket-shapes`")
    parser.add_argument("--cuda-graphs", action="store_true", help="and --cuda-graphs (CUDA; implies --bucket-shapes)")
    parser.add_argument("--compile-warmup", action="store_true", help="time --compile's warm-up instead")
    parser.add_argument("--generation", action="store_true", help="profile beam-search steps instead")
    parser.add_argument(
        "--sentences",
        type=int,
        help="--generation: the sources batched, as bench_gpu.py's "
        f"[default: {GPU_DEFAULTS['sentences']}; cpu: {CPU_DEFAULTS['sentences']}]",
    )
    parser.add_argument("--steps", type=int, default=10, help="--generation: decoder steps profiled per search")
    parser.add_argument("--results", help="append the figures to this file as JSON lines")
    args = parser.parse_args()
    if args.generation and args.compile_warmup:
        parser.error("--generation and --compile-warmup: one at a time")
    if args.cuda_graphs and args.device != "cuda":
        parser.error("--cuda-graphs: CUDA graphs need --device cuda")
    args.bucket_shapes = args.bucket_shapes or args.cuda_graphs
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: profile at least one decoder step")
    cpu = args.device == "cpu"
    defaults = CPU_DEFAULTS if cpu else GPU_DEFAULTS
    args.arch = args.arch or ("transformer_tiny" if cpu else "transformer_base")
    args.precision = args.precision or ("fp32" if cpu else "bf16")
    if args.generation:
        args.max_tokens = args.max_tokens or defaults["gen_max_tokens"]
    args.max_tokens = args.max_tokens or (512 if cpu else 25000)
    args.sentences = args.sentences or defaults["sentences"]
    args.vocab = defaults["vocab"]
    return args


def main() -> None:
    args = parse_args()
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("profile_gpu: no CUDA device; skipped")
        return
    if cpu:
        torch.set_num_threads(1)
    if args.generation:
        profile_generation(args)
        return
    with tempfile.TemporaryDirectory(prefix="profile-gpu-") as tmp:
        data_dir = synthetic_data_dir(Path(tmp), 300 if cpu else 20_000, args.vocab)
        (Path(tmp) / "save").mkdir()
        trainer = build(args, data_dir, Path(tmp) / "save")
        plan = plan_epoch(
            trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
        )
        warm = run_updates(trainer, plan, 0, args.warmup)
        if trainer.graphs is not None:  # every profiled shape captured first, off the plan
            for ids in with_every_shape([], plan.batches[args.warmup : args.warmup + args.updates], trainer):
                trainer.train_step([ids])
        if args.compile_warmup:
            steady = run_updates(trainer, plan, args.warmup, args.updates)
            figures = {"warmup_s": round(warm, 1), "steady_ms_per_update": round(1e3 * steady / args.updates, 1)}
            print(f"{args.arch} --compile: {args.warmup} warm-up updates {warm:.1f} s, then {figures} ")
            what = f"compile {args.arch}"
        else:
            n_captures = trainer.graphs.n_captures if trainer.graphs is not None else 0
            figures = profile(trainer, plan, args.warmup, args.updates)
            assert trainer.graphs is None or trainer.graphs.n_captures == n_captures, "a profiled update captured"
            show(args.arch + options(args), figures)
            what = f"profile {args.arch}{options(args)}"
    record(args, what, figures)


if __name__ == "__main__":
    main()
