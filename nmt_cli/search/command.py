"""`nmt generate`'s input and output: pick the input (a binarized split or raw text, whole or one shard),
translate it with the search driver (search/translate.py), and write the records in input order."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from nmt_cli.checkpoint import load_checkpoint, search_config_of
from nmt_cli.config import GenerateConfig, SearchConfig
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.runtime import AMP_DTYPES, choose_device, resolve_precision, set_threads
from nmt_cli.search.hypothesis import Hypothesis
from nmt_cli.search.translate import Translator, translate, translator_from

logger = logging.getLogger(__name__)


def resolve_shard(cfg: GenerateConfig) -> tuple[int, int]:
    """--num-shards/--shard-id, or the torchrun rank and world size when those are not given."""
    num, shard = cfg.num_shards, cfg.shard_id
    if num == 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        num, shard = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
    if shard >= num:
        raise ConfigError(f"--shard-id {shard} must be below --num-shards {num}")
    return num, shard


def generate(cfg: GenerateConfig, search_overrides: dict[str, Any] | None = None) -> Summary:
    """Translate what cfg names with the checkpoint's search settings, overridden by `search_overrides`."""
    if (cfg.data_dir is None) == (cfg.input is None):
        raise ConfigError("give either DATA_DIR (with --gen-subset) or --input FILE|-, not both or neither")
    num_shards, shard_id = resolve_shard(cfg)
    if cfg.input == "-" and num_shards > 1:
        raise ConfigError("--num-shards needs --input FILE or DATA_DIR; stdin cannot be split")
    if cfg.input not in (None, "-") and not Path(cfg.input).is_file():
        raise DataError(f"--input {cfg.input} does not exist")
    set_threads(cfg.threads)
    device = choose_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    state = load_checkpoint(Path(cfg.path))
    precision = generation_precision(cfg.precision, device, state)
    translator = translator_from(state, Path(cfg.path), device, AMP_DTYPES[precision])
    search = replace(search_config_of(state), **(search_overrides or {}))
    del state  # the model holds its own copy of the weights
    fmt = cfg.output_format or ("fairseq" if cfg.data_dir else "plain")
    with ExitStack() as stack:
        out = open_output(cfg, stack, num_shards, shard_id)
        if cfg.data_dir is not None:
            summary = generate_split(translator, Path(cfg.data_dir), cfg.gen_subset, search, cfg.max_tokens,
                                     cfg.batch_size, fmt, out, (num_shards, shard_id))
        else:
            lines = open_input(cfg.input, stack, num_shards, shard_id)
            summary = generate_text(translator, lines, search, cfg.max_tokens, cfg.batch_size, fmt, out,
                                    cfg.buffer_size)
    logger.info("translated %d sentences (%d tokens) in %.1f s: %.1f sentences/s, %.0f tokens/s "
                "(beam %d, lenpen %g %s)", summary.n_sentences, summary.n_tokens, summary.seconds,
                summary.n_sentences / max(summary.seconds, 1e-9), summary.n_tokens / max(summary.seconds, 1e-9),
                search.beam, search.lenpen, search.lenpen_style)
    return summary


def generation_precision(precision: str | None, device: torch.device, state: dict[str, Any]) -> str:
    """--precision, else the checkpoint's training precision on CUDA; fp32 on CPU (its fastest float path)."""
    if precision is None:
        precision = state["train_config"].get("precision") if device.type == "cuda" else "fp32"
    return resolve_precision(device, precision)


def open_output(cfg: GenerateConfig, stack: ExitStack, num_shards: int, shard_id: int) -> TextIO:
    if cfg.results_path is None:
        return sys.stdout
    results_path = Path(cfg.results_path)
    try:
        results_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create --results-path {cfg.results_path}: {e.strerror}") from None
    name = f"generate-{cfg.gen_subset if cfg.data_dir else 'input'}"
    name += f".shard{shard_id}-of-{num_shards}.txt" if num_shards > 1 else ".txt"
    return stack.enter_context((results_path / name).open("w", encoding="utf-8"))


def open_input(path: str | None, stack: ExitStack, num_shards: int, shard_id: int) -> list[str] | TextIO:
    if path == "-":
        return sys.stdin
    assert path is not None
    stream = stack.enter_context(Path(path).open(encoding="utf-8", errors="strict"))
    if num_shards == 1:
        return stream
    lines = stream.readlines()
    return [lines[i] for i in shard_range(len(lines), num_shards, shard_id)]


def read_lines(stream: Iterable[str], buffer_size: int) -> Iterator[list[str]]:
    """Chunks of up to `buffer_size` lines (newlines stripped), so that stdin streams."""
    chunk: list[str] = []
    for line in stream:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == buffer_size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def shard_range(n: int, num_shards: int, shard_id: int) -> range:
    """Contiguous shard `shard_id` of `num_shards` over n items: concatenating shard outputs in id order
    restores the input order."""
    return range(n * shard_id // num_shards, n * (shard_id + 1) // num_shards)


def format_record(i: int, hyps: list[Hypothesis], vocab: Vocab, fmt: str, source: str | None = None,
                  reference: str | None = None) -> str:
    """Output lines for one input. fairseq: S/T/H/D/P lines; scores are natural-log (nats)."""
    if fmt == "plain":
        return "\n".join(vocab.decode(h.tokens) for h in hyps)
    if fmt == "jsonl":
        return json.dumps({"id": i, "source": source, "hypotheses": [
            {"text": vocab.decode(h.tokens), "score": round(h.score, 4), "tokens": vocab.pieces(h.tokens),
             "positional_scores": [round(s, 4) for s in h.positional_scores]} for h in hyps]}, ensure_ascii=False)
    lines = []
    if source is not None:
        lines.append(f"S-{i}\t{source}")
    if reference is not None:
        lines.append(f"T-{i}\t{reference}")
    for h in hyps:
        lines.append(f"H-{i}\t{h.score:.4f}\t{' '.join(vocab.pieces(h.tokens))}")
        lines.append(f"D-{i}\t{h.score:.4f}\t{vocab.decode(h.tokens)}")
        lines.append(f"P-{i}\t{' '.join(f'{s:.4f}' for s in h.positional_scores)}")
    return "\n".join(lines)


@dataclass
class Summary:
    n_sentences: int = 0
    n_tokens: int = 0
    seconds: float = 0.0

    def add(self, results: list[list[Hypothesis]], seconds: float) -> None:
        self.n_sentences += len(results)
        self.n_tokens += sum(len(h.tokens) + 1 for hyps in results for h in hyps[:1])
        self.seconds += seconds


def generate_split(tr: Translator, data_dir: Path, subset: str, cfg: SearchConfig, max_tokens: int,
                   batch_size: int, fmt: str, out: TextIO, shard: tuple[int, int]) -> Summary:
    """Translate a binarized split (or one contiguous shard of it); write records in input order."""
    from nmt_cli.data.dataset import ParallelDataset

    data = ParallelDataset(data_dir, subset)
    ids = shard_range(len(data), *shard)
    summary = Summary()
    start = time.perf_counter()
    results = translate(tr, [data.src[i] for i in ids], cfg, max_tokens, batch_size)
    summary.add(results, time.perf_counter() - start)
    for i, hyps in zip(ids, results):
        print(format_record(i, hyps, tr.vocab, fmt, tr.vocab.decode(data.src[i]), tr.vocab.decode(data.tgt[i])),
              file=out)
    return summary


def generate_text(tr: Translator, lines: Iterable[str], cfg: SearchConfig, max_tokens: int, batch_size: int,
                  fmt: str, out: TextIO, buffer_size: int) -> Summary:
    """Translate raw text with the checkpoint's own sentencepiece model, one buffer at a time."""
    summary = Summary()
    first_id = 0
    for chunk in read_lines(lines, buffer_size):
        start = time.perf_counter()
        sources = [np.asarray(ids, dtype=np.int64) for ids in tr.vocab.encode(chunk)]
        results = translate(tr, sources, cfg, max_tokens, batch_size)
        summary.add(results, time.perf_counter() - start)
        for j, hyps in enumerate(results):
            print(format_record(first_id + j, hyps, tr.vocab, fmt, chunk[j] if fmt != "plain" else None), file=out)
        out.flush()
        first_id += len(chunk)
    return summary
