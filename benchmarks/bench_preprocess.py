"""Preprocess speed: `nmt preprocess` on Multi30k EN-DE (29k pairs, train + valid + test, joint 8k
sentencepiece), with and without training the sentencepiece model, and peak RSS."""

from __future__ import annotations

import shutil

from common import MULTI30K, NMT, WORK, preprocess_args, report, run


def main() -> None:
    rows = []
    n_lines = sum(
        len((MULTI30K / f"{s}.en").read_text(encoding="utf-8").splitlines())
        for s in ("train", "valid", "test_2016_flickr")
    )
    spm = None
    for label in ("train spm + binarize", "binarize with --spm-model"):
        dest = WORK / "bench-preprocess"
        shutil.rmtree(dest, ignore_errors=True)
        extra = ["--spm-model", str(spm)] if spm else []
        _, seconds, rss = run(NMT + preprocess_args(dest, *extra))
        rows.append(
            {
                "run": label,
                "pairs": n_lines,
                "seconds": round(seconds, 2),
                "pairs/s": n_lines / seconds,
                "peak_rss_gb": round(rss, 2),
            }
        )
        print(rows[-1], flush=True)
        spm = WORK / "bench.spm.model"
        shutil.copy(dest / "spm.model", spm)
    report("preprocess", rows)


if __name__ == "__main__":
    main()
