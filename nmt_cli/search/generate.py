"""`nmt generate`: load a checkpoint, batch inputs by length, search, and return results in input order."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.vocab import EOS, PAD, Vocab
from nmt_cli.errors import ConfigError
from nmt_cli.model.linear import pack_for_cpu_inference
from nmt_cli.model.quantize import quantize_for_cpu_inference
from nmt_cli.model.transformer import Transformer, build_model
from nmt_cli.runtime import autocast
from nmt_cli.search.beam import Hypothesis, beam_search
from nmt_cli.search.greedy import greedy_search
from nmt_cli.checkpoint import load_checkpoint, load_model_weights, model_config_of, vocab_of

logger = logging.getLogger(__name__)


@dataclass
class Translator:
    """Everything a search needs: the model, its vocabulary, and where and how to run."""

    model: Transformer
    vocab: Vocab
    device: torch.device
    amp_dtype: torch.dtype | None = None


def load_translator(path: Path, device: torch.device, amp_dtype: torch.dtype | None,
                    quantize: str | None = None) -> tuple[Translator, dict]:
    """Build the model a checkpoint describes and load its weights; returns it with the raw checkpoint.

    quantize="int8" (CPU, no autocast) swaps the linears for dynamic int8 ones; the checkpoint's float
    tensors are then dropped from the returned dict, so no float32 copy of the weights stays alive.
    """
    if quantize is not None and (device.type != "cpu" or amp_dtype is not None):
        raise ConfigError(f"--quantize {quantize} runs on the CPU in float32; drop --bf16/--fp16 and use --device cpu")
    state = load_checkpoint(path)
    model = build_model(model_config_of(state, path))
    load_model_weights(model, state["model"], path)
    model.to(device).eval()
    if quantize == "int8":
        quantize_for_cpu_inference(model)
        state = {k: v for k, v in state.items() if k not in ("model", "optimizer", "scheduler", "rng_state")}
    elif device.type == "cpu" and amp_dtype is None and torch.backends.mkldnn.is_available():
        pack_for_cpu_inference(model)
    return Translator(model, vocab_of(state, path), device, amp_dtype), state


def length_batches(lengths: np.ndarray, max_tokens: int, batch_size: int) -> list[np.ndarray]:
    """Indices sorted by length (longest first), cut so that n * (max_len + 1) <= max_tokens and n <= batch_size."""
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        longest = int(lengths[order[start]]) + 1
        n = max(1, min(batch_size or len(order), max_tokens // longest))
        batches.append(order[start:start + n])
        start += n
    return batches


def search_batch(tr: Translator, sources: Sequence[np.ndarray], cfg: SearchConfig,
                 generator: torch.Generator | None) -> list[list[Hypothesis]]:
    """Encode one padded batch and run beam, greedy or sampling search."""
    n, width = len(sources), max(len(s) for s in sources) + 1
    src = torch.full((n, width), PAD, dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, :len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        src[i, len(s)] = EOS
    src = src.to(tr.device)
    src_lens = torch.tensor([len(s) for s in sources], device=tr.device)
    with torch.inference_mode(), autocast(tr.device, tr.amp_dtype):
        enc = tr.model.encode(src, src.eq(PAD))
        if cfg.sampling or cfg.beam == 1:
            if cfg.nbest > 1:  # independent samples: repeat each sentence nbest times
                rep = torch.arange(n, device=tr.device).repeat_interleave(cfg.nbest)
                enc = type(enc)(enc.memory[rep], enc.src_pad_mask[rep])
                hyps = greedy_search(tr.model, enc, src_lens[rep], cfg, generator)
                return [[h[0] for h in hyps[i * cfg.nbest:(i + 1) * cfg.nbest]] for i in range(n)]
            return greedy_search(tr.model, enc, src_lens, cfg, generator)
        return beam_search(tr.model, enc, src_lens, cfg)


def translate(tr: Translator, sources: Sequence[np.ndarray], cfg: SearchConfig, max_tokens: int,
              batch_size: int = 0) -> list[list[Hypothesis]]:
    """Translate token-id sequences (no EOS); results come back in input order.

    Empty sources get an empty hypothesis without running the model; sources longer than the
    model's positions are cut (with a warning).
    """
    limit = tr.model.max_positions - 1
    n_cut = sum(len(s) > limit for s in sources)
    if n_cut:
        logger.warning("%d input(s) longer than the model's %d positions were truncated", n_cut, limit)
    sources = [s[:limit] for s in sources]
    lengths = np.array([len(s) for s in sources], dtype=np.int64)
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, [])] for _ in sources]
    generator = torch.Generator(device=tr.device).manual_seed(cfg.seed) if cfg.sampling else None
    nonempty = np.flatnonzero(lengths > 0)
    for batch in length_batches(lengths[nonempty], max_tokens, batch_size):
        ids = nonempty[batch]
        for i, hyps in zip(ids, search_batch(tr, [sources[i] for i in ids], cfg, generator)):
            results[i] = hyps
    return results


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
        import json

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
