"""`nmt score-pairs`: the model's score of given translations. Reads --source and --target (raw text, a sentence a
line, checked as generate checks --input), scores them with search/forced.py's teacher-forced pass, and writes one
line per pair in input order (`format_score`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from nmt_cli.commands.generate import SPLIT_CHUNK
from nmt_cli.commands.side_lines import SideLines, in_chunks, read_beside, text_lines
from nmt_cli.config import ScorePairsConfig
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.runtime import set_threads
from nmt_cli.search.forced import PairScore, forced_scores
from nmt_cli.search.settings import available_memory, batch_size_within, pass_memory
from nmt_cli.search.translate import open_for_inference

TRANSLATION_LINE = "one translation per source line"  # what --target gives, as its errors say it

logger = logging.getLogger(__name__)


def score_pairs(
    cfg: ScorePairsConfig, search_overrides: dict[str, Any] | None = None, out: TextIO | None = None
) -> int:
    """Score every (--source, --target) line pair with the checkpoint's search settings for lenpen, lenpen_style
    and unkpen, overridden by `search_overrides`; write the records to `out` (stdout). Returns the pairs scored.
    DataError: a file that ends before the other (at its line), or a line generate would refuse."""
    set_threads(cfg.threads)
    inference = open_for_inference(cfg, search_overrides or {})
    if inference.saved.is_parser:
        raise ConfigError(f"{cfg.path} is a parsing model; score-pairs scores translations of a translation model")
    translator, search = inference.translator(), inference.search
    have = available_memory(translator.device)  # before any pass: each batch's pairs fit in it (pass_memory)
    out = out or sys.stdout
    seconds, n_tokens, n_pairs = 0.0, 0, 0
    for src_lines, tgt_lines in read_pairs(cfg.source, cfg.target, cfg.target_format == "pieces"):
        start = time.perf_counter()  # timed as generate times a chunk: encoding and the passes, not reading or writing
        sources = translator.vocab.encode_arrays(src_lines)
        targets = encode_targets(translator.vocab, tgt_lines, cfg, n_pairs)
        need = pass_memory(inference.bounds, max(map(len, targets), default=0) + 1)
        batch_size = batch_size_within(cfg.batch_size, need, have)
        scored = forced_scores(translator, sources, targets, search, cfg.max_tokens, batch_size)
        seconds += time.perf_counter() - start
        n_tokens += sum(len(p.token_scores) for p in scored)
        for i, p in enumerate(scored, start=n_pairs):
            print(format_score(i, p, translator.vocab, cfg.output_format), file=out)
        out.flush()
        n_pairs += len(scored)
    logger.info(
        "scored %d pairs (%d target tokens) in %.1f s: %.1f pairs/s (lenpen %g %s, unkpen %g)",
        n_pairs,
        n_tokens,
        seconds,
        n_pairs / max(seconds, 1e-9),
        search.lenpen,
        search.lenpen_style,
        search.unkpen,
    )
    return n_pairs


def read_pairs(source: str, target: str, target_pieces: bool = False) -> Iterator[tuple[list[str], list[str]]]:
    """(source lines, target lines) of SPLIT_CHUNK line pairs at a time, each file opened once and a target line read
    with each source line (side_lines.read_beside: pipes work as files do; DataError where one file ends first), each
    line checked (text_lines; the target's as pieces where `target_pieces`)."""
    with Path(source).open("rb") as src_file, Path(target).open("rb") as tgt_file:
        targets = SideLines("--target", target, TRANSLATION_LINE, text_lines(tgt_file, target, pieces=target_pieces))
        lines = read_beside(text_lines(src_file, source), [targets], f"--source {source}")
        for chunk in in_chunks(lines, SPLIT_CHUNK):
            yield chunk, targets.take(len(chunk))[0]


def encode_targets(vocab: Vocab, lines: list[str], cfg: ScorePairsConfig, first: int) -> list[np.ndarray]:
    """The target lines' ids: the text encoded, or (--target-format pieces) the pieces written; DataError
    `TARGET:LINE: ...` for a piece the vocabulary lacks."""
    if cfg.target_format == "text":
        return vocab.encode_arrays(lines)
    targets = []
    for line_number, line in enumerate(lines, start=first + 1):
        try:
            targets.append(np.asarray(vocab.piece_ids(line.split()), dtype=np.int64))
        except DataError as e:
            raise DataError(f"{cfg.target}:{line_number}: {e} (--target-format pieces)") from None
    return targets


def format_score(i: int, p: PairScore, vocab: Vocab, fmt: str) -> str:
    """One output line: plain the score; jsonl {"id", "score", "log_prob", "tokens", "token_scores"} (nats)."""
    if fmt == "plain":
        return f"{p.score:.4f}"
    record = {
        "id": i,
        "score": round(p.score, 4),
        "log_prob": round(p.log_prob, 4),
        "tokens": vocab.pieces(p.tokens),
        "token_scores": [round(s, 4) for s in p.token_scores],
    }
    return json.dumps(record, ensure_ascii=False)
