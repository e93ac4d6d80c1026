"""Child process for bench_generate.py: translate a file with CTranslate2 on an exported `nmt` model.

Prints `translated N sentences in S s: X sentences/s, Y tokens/s` on stderr, as `nmt generate` does;
the timed part is sentencepiece encoding plus `translate_batch`, as in nmt's own figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ctranslate2
import sentencepiece as spm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("input", type=Path)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=1)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--lenpen", type=float, default=0.6)
    args = parser.parse_args()
    lines = args.input.read_text(encoding="utf-8").splitlines()
    sp = spm.SentencePieceProcessor(model_file=str(args.model_dir / "sentencepiece.model"))
    translator = ctranslate2.Translator(
        str(args.model_dir), device="cpu", compute_type=args.compute_type, inter_threads=1, intra_threads=args.threads
    )
    start = time.perf_counter()
    tokens = sp.encode(lines, out_type=str)
    results = translator.translate_batch(
        tokens,
        beam_size=args.beam,
        max_batch_size=args.batch_size,
        length_penalty=args.lenpen,
        min_decoding_length=args.min_len,
        max_decoding_length=args.max_len,
    )
    seconds = time.perf_counter() - start
    n_tokens = sum(len(r.hypotheses[0]) + 1 for r in results)
    for r in results:
        print(sp.decode(r.hypotheses[0]))
    print(
        f"translated {len(lines)} sentences in {seconds:.1f} s: {len(lines) / seconds:.1f} sentences/s, "
        f"{n_tokens / seconds:.0f} tokens/s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
