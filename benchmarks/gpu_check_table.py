"""gpu_check.sh's closing table, in Markdown, from what its steps left: OUT_DIR's results.jsonl (each figure
and step time, bench_fairseq.py's side by side among them), env.log, tests.log and serve.log, and the recipe's
score and log in WORK/multi30k.

    python benchmarks/gpu_check_table.py OUT_DIR WORK SECONDS
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def step_times(results: list[dict]) -> dict[str, str]:
    """Each step's 'N s' (or 'failed: exit C after N s', 'skipped: why')."""
    times = {}
    for r in results:
        if "step" not in r:
            continue
        if "skipped" in r:
            times[r["step"]] = f"skipped: {r['skipped']}"
        else:
            ok = r["rc"] == 0
            times[r["step"]] = f"{r['seconds']} s" if ok else f"failed: exit {r['rc']} after {r['seconds']} s"
    return times


def test_result(out: Path) -> str:
    log = out / "tests.log"
    lines = log.read_text().splitlines() if log.exists() else []
    summary = [line for line in lines if re.search(r"\d+ (passed|failed|skipped|deselected|error)", line)]
    return summary[-1].strip("= ") if summary else "no result"


def bench_rows(results: list[dict]) -> list[tuple[str, str]]:
    rows = []
    for r in results:
        if not r.get("what", "").startswith(("train", "generate")):
            continue
        if r["what"].startswith("train"):
            rows.append(
                (
                    f"{r['what']} ({r['precision']})",
                    f"{r['target_tok_s']:,} target tok/s, {r['ms_per_update']} ms/update, MFU {r['mfu']:.1%}, "
                    f"{r['peak_gib']} GiB",
                )
            )
        else:
            rows.append(
                (
                    f"{r['what']} ({r['precision']})",
                    f"{r['sentences']:,} sentences in {r['seconds']} s ({r['tokens_s']:,} tokens/s)",
                )
            )
    return rows


def profile_rows(results: list[dict]) -> list[tuple[str, str]]:
    rows = []
    for r in (r for r in results if r.get("what", "").startswith("profile")):
        if "ms_per_step" in r:
            rows.append((r["what"], search_step(r)))
            continue
        busy = "n/a" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}"
        top = r["kernels_ms"][0][1][:60] if r["kernels_ms"] else "none"
        host = r["host_ops_ms"][0] if r["host_ops_ms"] else [0, "none", 0]
        rows.append(
            (
                r["what"],
                f"{r['wall_ms_per_update']} ms/update, GPU busy {busy}; costliest kernel {top}; "
                f"top host op {host[1]} {host[0]} ms",
            )
        )
    for r in (r for r in results if r.get("what", "").startswith("compile")):
        rows.append((r["what"], f"8 warm-up updates {r['warmup_s']} s, then {r['steady_ms_per_update']} ms/update"))
    return rows


def search_step(r: dict) -> str:
    """profile_gpu.py --generation's figures of one batching and search: ms/step, GPU busy, launches per step."""
    top = r["kernels_ms"][0][1][:60] if r["kernels_ms"] else "none"
    host = r["host_ops_ms"][0] if r["host_ops_ms"] else [0, "none", 0]
    if r["launches_per_step"] is None:
        gpu = "no CUDA"
    else:
        busy = "n/a" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%} ({r['kernel_ms_per_step']} ms/step of kernels)"
        gpu = (
            f"GPU busy {busy}; per step {r['launches_per_step']} kernel launches, {r['graph_launches_per_step']} "
            f"graph launches, {r['kernels_per_step']} kernels run"
        )
    return (
        f"{r['ms_per_step']} ms/step ({r['profiled_ms_per_step']} profiled), {gpu}; costliest kernel {top}; "
        f"top host op {host[1]} {host[0]} ms/step"
    )


def fairseq_rows(results: list[dict]) -> list[tuple[str, str]]:
    """bench_fairseq.py's figures: per architecture nmt's target tok/s against fairseq's faster precision (the
    ratio nmt / fairseq) with each one's peak GPU memory, nmt's variants against its plain run, and the BLEU
    of each toolkit at equal updates."""
    speed = [r for r in results if r.get("what", "").startswith("speed ")]
    rows = []
    for what in dict.fromkeys(r["what"] for r in speed):
        arch = what.removeprefix("speed ")
        fairseq = [r for r in speed if r["what"] == what and r["toolkit"] == "fairseq" and "failed" not in r]
        failed = "".join(
            f"; fairseq --{r['precision']} failed ({r['failed']})" for r in speed if r["what"] == what and "failed" in r
        )
        nmt = {r.get("variant", ""): r for r in speed if r["what"] == what and r["toolkit"] == "nmt"}
        plain = nmt.get("")
        if plain and not fairseq:
            rows.append((f"nmt vs fairseq {arch}", f"nmt {plain['target_tok_s']:,} target tok/s{failed}"))
        if fairseq and plain:
            best = max(fairseq, key=lambda r: r["target_tok_s"])
            others = "".join(f"; fairseq --{r['precision']} {r['target_tok_s']:,}" for r in fairseq if r is not best)
            others += failed
            rows.append(
                (
                    f"nmt vs fairseq {arch}",
                    f"nmt {plain['target_tok_s']:,} target tok/s ({plain['precision']}, "
                    f"{plain['tokens_per_update']:,} tokens/update, {plain['peak_gib']} GiB), fairseq "
                    f"{best['target_tok_s']:,} (--{best['precision']}, {best['tokens_per_update']:,} tokens/update, "
                    f"{best['peak_gib']} GiB): **{plain['target_tok_s'] / best['target_tok_s']:.2f}x**{others}",
                )
            )
        for variant, r in nmt.items():
            if variant and plain:
                rows.append(
                    (
                        f"nmt {arch} {variant}",
                        f"{r['target_tok_s']:,} target tok/s ({r['target_tok_s'] / plain['target_tok_s']:.2f}x "
                        f"without), {r['peak_gib']} GiB",
                    )
                )
    quality = {r["toolkit"]: r for r in results if r.get("what") == "quality multi30k"}
    if quality:
        rows.append(
            (
                "Multi30k BLEU at equal updates",
                ", ".join(
                    f"{name} {r['bleu']} ({r['updates']:,} {r['precision']} updates in {r['train_s']} s)"
                    for name, r in quality.items()
                )
                + " (sacreBLEU, beam 4, test_2016_flickr)",
            )
        )
    return rows


def recipe_row(work: Path) -> tuple[str, str]:
    score = work / "score.txt"
    bleu = re.search(r"BLEU = ([\d.]+)", score.read_text()) if score.exists() else None
    updates = [r["update"] for r in read_lines(work / "train.jsonl") if "update" in r]
    if bleu is None:
        return ("Multi30k recipe", "no score (see recipe.log)")
    return ("Multi30k recipe", f"sacreBLEU {bleu.group(1)} on test_2016_flickr after {max(updates, default=0)} updates")


def serve_rows(out: Path) -> list[tuple[str, str]]:
    """bench_serve.py's tables in serve.log (one per run: `== serve`, `== serve-slots` start them), a row each;
    no row for a run that printed no table."""
    log = out / "serve.log"
    runs: list[dict[str, str]] = []
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith("== serve"):
            runs.append({})
        elif runs and (found := re.match(r"\s*(\S.*?)\s{2,}(\S.*)$", line)):
            runs[-1][found.group(1)] = found.group(2).strip()
    return [serve_row(figure) for figure in runs if "serve sent/s" in figure]


def serve_row(figure: dict[str, str]) -> tuple[str, str]:
    return (
        f"serve ({figure.get('search', 'default')} search)",
        f"32 clients {figure.get('serve sent/s')} sent/s ({figure.get('ratio')}x generate's "
        f"{figure.get('generate sent/s')}, {figure.get('ratio to batch of 32')}x its batches of 32), "
        f"p50 / p99 {figure.get('p50 ms')} / {figure.get('p99 ms')} ms "
        f"(2 x generate's batch of 32: {2 * float(figure.get('generate batch of 32 ms', 'nan')):.0f} ms); "
        f"1 client {figure.get('1 client ms')} ms (generate {figure.get('generate 1 sentence ms')} ms, "
        f"serving's own {figure.get('1 client added ms')} ms)",
    )


def main() -> None:
    out, work, seconds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    env = (out / "env.log").read_text().splitlines() if (out / "env.log").exists() else []
    torch_line = next((line for line in env if line.startswith("torch ")), "torch: unknown")
    results = read_lines(out / "results.jsonl")
    times = step_times(results)
    rows = [("device", torch_line), ("GPU tests", f"{test_result(out)} ({times.get('tests', 'not run')})")]
    rows += bench_rows(results) + [("bench time", times.get("bench", "not run"))]
    rows += fairseq_rows(results)
    rows += [
        ("fairseq time", f"speed {times.get('fairseq', 'not run')}; quality {times.get('fairseq-quality', 'not run')}")
    ]
    rows += profile_rows(results)
    rows += [
        (
            "profile time",
            f"training {times.get('profile', 'not run')}; with CUDA graphs {times.get('profile-graphs', 'not run')}; "
            f"generation {times.get('profile-generation', 'not run')}",
        )
    ]
    rows += [("recipe", f"{recipe_row(work / 'multi30k')[1]} ({times.get('recipe', 'not run')})")]
    rows += serve_rows(out)
    serve_times = f"default {times.get('serve', 'not run')}; --fixed-slots {times.get('serve-slots', 'not run')}"
    rows += [("serve time", serve_times)]
    rows += [("decoding step (figures in bench.log)", times.get("decoding", "not run"))]
    rows += [("compile step", times.get("compile", "not run")), ("gpu_check.sh in all", f"{seconds} s")]
    print("| what | measured |\n|---|---|")
    for what, value in rows:
        print(f"| {what} | {value} |")


if __name__ == "__main__":
    main()
