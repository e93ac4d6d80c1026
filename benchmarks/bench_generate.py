"""Generation speed: `nmt generate` on 500 Multi30k sentences, 2 threads, batches of 64 sentences.

"forced": every hypothesis is exactly 24 tokens (--min-len 24 --max-len-a 0 --max-len-b 24), so every
toolkit and checkpoint does the same work (the setting the peers were measured in); "natural": the
model's own lengths, max length input + 50, which only means something for a trained model, so it uses
--trained (default: the Multi30k recipe's average.pt, skipped when absent) and only for its shape.

--precisions: fp32, bf16, int8 (`nmt generate --quantize int8`), and where ctranslate2 is installed
ct2-fp32 and ct2-int8: CTranslate2 on the same checkpoint after `nmt export` (compute_type float32 or
int8), same sentences, beam, batch of 64 sentences and 2 threads, through benchmarks/ct2_translate.py.
CTranslate2's forced length is min = max = 25 decoding steps, nmt's 24 tokens plus the forced EOS.

--searches default,slots runs nmt's rows with each beam search, side by side: default (no flag, the
search that drops finished sentences) and slots (`--fixed-slots`, search/slots.py: rows stay, masked once
finished, until the live ones fit in fewer). --rounds N runs each row N times, alternating the searches
round after round so that the machine's drift falls on both alike, and reports the medians; --sentences takes
fewer (or more) test sentences.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from itertools import product
from pathlib import Path

from common import MULTI30K, NMT, ROOT, WORK, checkpoint, number, report, run

FORCED = ["--min-len", "24", "--max-len-a", "0", "--max-len-b", "24"]


def ct2_command(path: Path, src: Path, precision: str, beam: str, length: str) -> list[str] | None:
    """The CTranslate2 child command for an exported copy of `path`, or None without ctranslate2."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return None
    model_dir = path.parent / f"{path.stem}-ct2"
    if not (model_dir / "model.bin").exists() or model_dir.stat().st_mtime < path.stat().st_mtime:
        run(NMT + ["export", "--path", str(path), "--output", str(model_dir), "--force"])
    lengths = ["--min-len", "25", "--max-len", "25"] if length == "forced" else ["--max-len", "256"]
    return [
        sys.executable,
        str(ROOT / "benchmarks" / "ct2_translate.py"),
        str(model_dir),
        str(src),
        "--beam",
        beam,
        "--threads",
        "2",
        "--batch-size",
        "64",
        "--compute-type",
        precision.removeprefix("ct2-"),
        *lengths,
    ]


def nmt_command(path: Path, src: Path, precision: str, beam: str, length: str, search: str) -> list[str]:
    """The `nmt generate` command of one row."""
    return NMT + [
        "generate",
        "--path",
        str(path),
        "--input",
        str(src),
        "--beam",
        beam,
        "--batch-size",
        "64",
        "--max-tokens",
        "100000",
        "--threads",
        "2",
        "--device",
        "cpu",
        *(FORCED if length == "forced" else ["--max-len-a", "1", "--max-len-b", "50"]),
        *(["--bf16"] if precision == "bf16" else []),
        *(["--quantize", "int8"] if precision == "int8" else []),
        *(["--fixed-slots"] if search == "slots" else []),
    ]


def timed_rows(commands: dict[str, list[str]], rounds: int) -> dict[str, dict]:
    """Run each command `rounds` times, alternating their order round after round (so that the machine's drift
    falls on them alike): each one's median sentences/s and tokens/s, and its largest peak RSS."""
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
    for r in range(rounds):
        for name in list(commands) if r % 2 == 0 else reversed(list(commands)):
            err, _, rss = run(commands[name])
            runs[name].append((number(r"([\d.]+) sentences/s", err), number(r"([\d.]+) tokens/s", err), rss))
            if rounds > 1:
                print(f"  round {r + 1} {name}: {runs[name][-1][0]} sentences/s", file=sys.stderr, flush=True)
    return {
        name: {
            "sent/s": statistics.median(r[0] for r in rs),
            "tok/s": statistics.median(r[1] for r in rs),
            "peak_rss_gb": round(max(r[2] for r in rs), 2),
        }
        for name, rs in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--beams", default="4,1")
    parser.add_argument("--precisions", default="fp32,int8,ct2-fp32,ct2-int8")
    parser.add_argument("--lengths", default="forced")
    parser.add_argument("--searches", default="default", help="default and/or slots (nmt's beam searches)")
    parser.add_argument("--sentences", type=int, default=500, help="test_2016_flickr sentences translated")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each row, alternated with the other searches' (median)"
    )
    parser.add_argument(
        "--trained",
        default=str(ROOT / "work" / "multi30k_en_de" / "average.pt"),
        help="trained transformer_small checkpoint for natural-length runs",
    )
    args = parser.parse_args()
    src = WORK / f"gen{args.sentences}.en"
    lines = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[: args.sentences]
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = []
    for shape in args.shapes.split(","):
        ckpt = checkpoint(shape)
        for beam, precision, length in product(
            args.beams.split(","), args.precisions.split(","), args.lengths.split(",")
        ):
            path = ckpt if length == "forced" else Path(args.trained)
            if length == "natural" and (shape != "small" or not path.exists()):
                continue
            if precision.startswith("ct2-"):  # CTranslate2's own search: once
                cmd = ct2_command(path, src, precision, beam, length)
                commands = {} if cmd is None else {"ct2": cmd}
            else:
                commands = {
                    search: nmt_command(path, src, precision, beam, length, search)
                    for search in args.searches.split(",")
                }
            for search, figures in timed_rows(commands, args.rounds).items():
                rows.append(
                    {
                        "shape": shape,
                        "beam": int(beam),
                        "precision": precision,
                        "length": length,
                        "search": search,
                        **figures,
                    }
                )
                print(rows[-1], flush=True)
    report("generate", rows)


if __name__ == "__main__":
    main()
