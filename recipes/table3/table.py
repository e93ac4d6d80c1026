"""Print the Table 3 recipe's results in the paper's layout: one line per row of rows.txt, the settings
that row changed (blank: as in the base row), parameters, valid perplexity and valid BLEU.

Usage: python table.py WORK_DIR ROW [ROW ...] [--minutes M]. Reads, for each row, WORK_DIR/rows/NAME/:
checkpoints/config.json (the settings), train.jsonl (updates; perplexity of the last validation, i.e.
the final checkpoint) and score.json (sacreBLEU of the averaged checkpoint's valid translation).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from nmt_cli.config import ModelConfig
from nmt_cli.model.transformer import build_model, count_parameters

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "pos")


def settings(config: dict) -> dict[str, str]:
    """The paper's Table 3 columns from a config.json written by `nmt train`."""
    m, t = config["model"], config["train"]
    d_v = m["d_model"] // m["heads"]
    return {"N": f"{m['encoder_layers']}" if m["encoder_layers"] == m["decoder_layers"]
            else f"{m['encoder_layers']}+{m['decoder_layers']}",
            "d_model": str(m["d_model"]), "d_ff": str(m["d_ff"]), "h": str(m["heads"]),
            "d_k": str(m.get("attention_key_dim") or d_v), "d_v": str(d_v), "P_drop": f"{m['dropout']:g}",
            "eps_ls": f"{t['label_smoothing']:g}", "pos": "learned" if m["learned_pos"] else "sinusoid"}


def n_parameters(model: dict) -> int:
    with torch.device("meta"):
        return count_parameters(build_model(ModelConfig(**{k: v for k, v in model.items()})))


def results(row_dir: Path) -> dict[str, str]:
    records = [json.loads(line) for line in (row_dir / "train.jsonl").read_text().splitlines() if line.strip()]
    valid = [r for r in records if r["event"] == "valid"]
    score = json.loads((row_dir / "score.json").read_text().splitlines()[0])
    return {"updates": str(max(r["update"] for r in records)),
            "PPL (dev)": f"{valid[-1]['valid_ppl']:.2f}" if valid else "-",
            "BLEU (dev)": f"{score['score']:.1f}"}


def table(work_dir: Path, names: list[str], minutes: float) -> str:
    lines = []
    header = ["row", *COLUMNS, "updates", "PPL (dev)", "BLEU (dev)", "params x10^6"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    base: dict[str, str] | None = None
    for name in names:
        row_dir = work_dir / "rows" / name.replace(":", "_")
        config = json.loads((row_dir / "checkpoints" / "config.json").read_text())
        s = settings(config)
        base = base or s
        shown = [v if name == names[0] or v != base[k] else "" for k, v in s.items()]
        params = f"{n_parameters(config['model']) / 1e6:.1f}"
        lines.append("| " + " | ".join([name, *shown, *results(row_dir).values(), params]) + " |")
    lines.append("")
    lines.append(f"Each row: {minutes:g} min of training wall clock; PPL: per-piece perplexity of the final "
                 "checkpoint on valid; BLEU: sacreBLEU of the averaged checkpoints on valid (beam 4, alpha 0.6).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--minutes", type=float, required=True)
    args = parser.parse_args()
    print(table(args.work_dir, args.rows, args.minutes))


if __name__ == "__main__":
    main()
