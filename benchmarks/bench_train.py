"""Training speed: target tokens/s and seconds/update after warm-up, `nmt train` on Multi30k EN-DE
(joint 8k vocabulary), --max-tokens 4096, 2 threads, float32 and --bf16, with each run's peak RSS.

tokens/s is nmt's own logged figure (target tokens over the time spent in update steps), averaged
over the log intervals after the first (warm-up) one; s/update is wall clock between those log lines.
`--quality-minutes M` also trains each setting for M minutes and reports the valid loss reached, so
the speed and the quality effect of bf16 are both visible. `--checkpoint-activations` also trains each setting
with `nmt train --checkpoint-activations` (each layer recomputed in the backward pass), whose peak RSS and speed
stand beside the plain run's (the issue's figure: `--shapes base`, 4,096 tokens, on the CPU).
`--epoch-pairs N` instead measures the wait at an epoch's start with N synthetic pairs (the issue's figure:
36,000,000, WMT14 EN-FR's size): before, each epoch bucketed its batches anew (`epoch_batches`); now a run buckets
once and each later epoch only draws and shuffles them (`plan_epoch`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

from common import NMT, WORK, precisions, report, run, train_args


def train_run(
    shape: str, precision: str, stop: list[str], log_interval: int, extra: tuple[str, ...] = ()
) -> tuple[list[dict], float]:
    """Train once; return the JSON-lines log records and the peak RSS in GB."""
    save = WORK / f"train-{shape}-{precision}{''.join(extra)}"
    shutil.rmtree(save, ignore_errors=True)
    save.mkdir(parents=True)
    log = save / "log.jsonl"
    _, _, rss = run(
        NMT
        + train_args(
            save,
            shape,
            4096,
            "--log-interval",
            str(log_interval),
            "--log-file",
            str(log),
            *stop,
            *(["--bf16"] if precision == "bf16" else []),
            *extra,
        )
    )
    return [json.loads(line) for line in log.read_text().splitlines()], rss


def speed_row(shape: str, precision: str, updates: int, extra: tuple[str, ...] = ()) -> dict:
    records, rss = train_run(shape, precision, ["--max-update", str(updates)], max(1, updates // 6), extra)
    train = [r for r in records if r["event"] == "train"][1:]  # the first interval is warm-up
    span = (train[-1]["elapsed_s"] - train[0]["elapsed_s"]) / (train[-1]["update"] - train[0]["update"])
    return {
        "shape": shape,
        "precision": precision,
        "activations": "recomputed" if "--checkpoint-activations" in extra else "kept",
        "updates": train[-1]["update"],
        "tgt_tok/s": sum(r["tgt_tok_per_s"] for r in train[1:]) / max(len(train) - 1, 1),
        "s/update": span,
        "peak_rss_gb": round(rss, 2),
    }


def epoch_boundary_row(n_pairs: int, max_tokens: int = 4096) -> dict:
    """Seconds of epoch planning with n_pairs pairs of WMT-like lengths (lognormal, ~29 pieces, 1-250)."""
    from types import SimpleNamespace

    import numpy as np

    from nmt_cli.config import TrainConfig
    from nmt_cli.data.batching import epoch_batches
    from nmt_cli.runtime import DistInfo
    from nmt_cli.train.epoch_plan import plan_epoch

    rng = np.random.default_rng(0)
    src = rng.lognormal(3.2, 0.6, n_pairs).clip(1, 250).astype(np.int64)
    tgt = (src * rng.normal(1.0, 0.15, n_pairs)).clip(1, 250).astype(np.int64)
    cfg = TrainConfig(data_dir="synthetic", save_dir="unused", max_update=1, max_tokens=max_tokens)
    data = SimpleNamespace(src_lens=src, tgt_lens=tgt, corpora={"train": range(n_pairs)}, batches={})

    def seconds(work) -> float:
        start = time.perf_counter()
        work()
        return time.perf_counter() - start

    def plan(epoch: int) -> None:
        plan_epoch(data, cfg, max_positions=1024, info=DistInfo(), epoch=epoch)  # type: ignore[arg-type]

    return {
        "pairs": n_pairs,
        "before: each epoch_s": seconds(lambda: epoch_batches(src, tgt, max_tokens, cfg.seed, 2, max_positions=1024)),
        "now: first epoch_s": seconds(lambda: plan(1)),
        "now: later epochs_s": seconds(lambda: plan(2)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--precisions", help="comma-separated [default: fp32,bf16; fp32 on CPUs without bf16]")
    parser.add_argument("--updates", type=int, default=0, help="updates per run [default: 60 small, 30 base]")
    parser.add_argument("--quality-minutes", type=float, default=0.0)
    parser.add_argument(
        "--checkpoint-activations", action="store_true", help="also each setting with --checkpoint-activations"
    )
    parser.add_argument("--epoch-pairs", type=int, default=0, help="only the epoch boundary's wait, with N pairs")
    args = parser.parse_args()
    if args.epoch_pairs:
        report("train-epoch-boundary", [epoch_boundary_row(args.epoch_pairs)])
        return
    chosen = precisions(args.precisions)
    rows = []
    variants = [(), ("--checkpoint-activations",)] if args.checkpoint_activations else [()]
    for shape in args.shapes.split(","):
        for precision, extra in ((p, e) for p in chosen for e in variants):
            row = speed_row(shape, precision, args.updates or (60 if shape == "small" else 30), extra)
            if args.quality_minutes and not extra:
                records, _ = train_run(shape, precision, ["--max-time-minutes", str(args.quality_minutes)], 100)
                valid = [r for r in records if r["event"] == "valid"]
                row.update(
                    {
                        "budget_min": args.quality_minutes,
                        "budget_updates": records[-1]["update"],
                        "budget_valid_loss": valid[-1]["valid_loss"],
                    }
                )
            rows.append(row)
            print(row, flush=True)
    report("train", rows)


if __name__ == "__main__":
    main()
