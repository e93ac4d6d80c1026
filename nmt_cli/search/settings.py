"""The search settings of one request, shared by `nmt generate` and `nmt serve`: the checkpoint's saved
settings with the options given (refusing those the search would ignore, and search sizes that cannot fit in
the device's memory), and the precision to search in.

The memory bound (`search_memory`, `search_batch_size`): each row of a search (a beam, or a sample) holds the
decoder's cached keys and values of every layer for each step, the step's log-probs and its hypotheses' tokens and
scores, counted at the longest output its length allows. generate (and score-pairs, by `pass_memory`) lowers each
batch's sentences to what fits in the memory available (`available_memory`), and refuses, with one line naming the
option, sizes for which even one sentence cannot fit: a one-piece sentence's when the settings are read, each
input's longest when its batch is made."""

from __future__ import annotations

import functools
import os
import resource
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

import torch

from nmt_cli.config import ModelConfig, SearchConfig
from nmt_cli.errors import ConfigError
from nmt_cli.flags import flag_name
from nmt_cli.runtime import AMP_DTYPES, resolve_precision
from nmt_cli.search.beam import max_lengths

SAMPLING_FIELDS = ("sampling_topk", "sampling_topp", "temperature", "seed")  # options that only sampling reads


@dataclass(frozen=True)
class SearchBounds:
    """What bounds a search's sizes: the model's shape, the element size of its cached keys and values, and the
    device whose memory holds them."""

    vocab_size: int  # V: the log-probs of each row and step
    decoder_layers: int
    state_width: int  # a layer's cached key and value widths together, per row and step: H*Dk + d_model
    max_positions: int
    element_size: int  # bytes of one cached key or value: 2 under bf16/fp16 autocast, else 4
    device: torch.device


def search_bounds(model: ModelConfig, device: torch.device, precision: str) -> SearchBounds:
    """The SearchBounds of a model of this shape searched on `device` in `precision` (generation_precision's)."""
    key_width = model.heads * (model.attention_key_dim or model.d_model // model.heads)
    amp = AMP_DTYPES[precision]
    element_size = 4 if amp is None else torch.finfo(amp).bits // 8
    return SearchBounds(
        model.vocab_size, model.decoder_layers, key_width + model.d_model, model.max_positions, element_size, device
    )


@functools.lru_cache(maxsize=4096)
def longest_output(search: SearchConfig, pieces: int, max_positions: int) -> int:
    """The output length a text of `pieces` pieces may reach under `search` (`max_lengths`: a * |x| + b within the
    positions). Asked several times per request on serve's event loop (caps, memory, the batcher's steps bound),
    with few distinct arguments: remembered, as a tensor per call costs more than the rest of a request's checks
    together (benchmarks/profile_serve.py --event-loop)."""
    return int(max_lengths(torch.tensor([pieces]), search, max_positions)[0])


def search_memory(search: SearchConfig, bounds: SearchBounds, src_len: int = 1) -> int:
    """Bytes one sentence of `src_len` pieces holds when its search runs to the longest output it allows (see the
    module's docstring); of a one-piece sentence, a lower bound on what any sentence may need under these settings."""
    rows = search.nbest if search.sampling else search.beam
    steps = longest_output(search, src_len, bounds.max_positions) + 1  # EOS included
    cache = bounds.decoder_layers * steps * bounds.state_width * bounds.element_size
    log_probs = bounds.vocab_size * 4  # float32
    hypotheses = 2 * steps * (8 + 4)  # alive and finished: int64 tokens, float32 step scores
    return rows * (cache + log_probs + hypotheses)


def pass_memory(bounds: SearchBounds, tgt_len: int) -> int:
    """Bytes one pair's teacher-forced pass holds (search/forced.py) at each of its `tgt_len` positions: the
    decoder's keys and values of every layer, and the logits over the vocabulary with their normalisation."""
    return tgt_len * (bounds.decoder_layers * bounds.state_width * bounds.element_size + 2 * bounds.vocab_size * 4)


def available_memory(device: torch.device) -> int | None:
    """Bytes a search may still allocate on `device`: on CUDA the free memory plus what PyTorch's caching
    allocator holds unused; on the CPU the system's available memory (MemAvailable, or the free pages where
    /proc/meminfo is missing), and no more than the process's address-space limit leaves (`ulimit -v`). None where
    neither is known."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    room: int | None = None
    with suppress(OSError), open("/proc/meminfo") as f:
        room = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    if room is None:
        with suppress(ValueError, OSError):
            room = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY:
        with open("/proc/self/statm") as f:
            left = max(limit - int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE"), 0)
        room = left if room is None else min(room, left)
    return room


def batch_size_within(batch_size: int, need: int, have: int | None) -> int:
    """--batch-size (0: no cap) lowered to the sentences (or pairs) of `need` bytes each that fit in `have` bytes
    (None: unknown, no bound), and never below one."""
    if have is None:
        return batch_size
    fits = max(have // need, 1)
    return min(batch_size or fits, fits)


def search_batch_size(
    search: SearchConfig, bounds: SearchBounds, longest: int, *, batch_size: int, have: int | None
) -> int:
    """The sentences a batch of sources of up to `longest` pieces may hold: --batch-size (0: no cap) lowered so that
    their rows (sentences x --beam, or x --nbest samples) fit in `have` bytes (`available_memory`, taken once before
    the searches; None: no bound). ConfigError naming --beam (--nbest) where even one such sentence cannot fit."""
    need = search_memory(search, bounds, longest)
    if have is not None and need > have:
        option, rows = ("--nbest", search.nbest) if search.sampling else ("--beam", search.beam)
        steps = longest_output(search, longest, bounds.max_positions)
        raise ConfigError(
            f"{option} {rows} cannot fit: searching even one sentence{f' of {longest} pieces' if longest > 1 else ''}"
            f" with {rows} {'samples' if search.sampling else 'hypotheses'} of up to {steps} pieces needs about "
            f"{size(need)} (each holds the decoder's keys and values of every step and {bounds.vocab_size} scores; "
            f"--max-tokens splits a batch down to one sentence, no further), and {bounds.device} has {size(have)} "
            f"available; give a smaller {option}"
        )
    return batch_size_within(batch_size, need, have)


def size(n_bytes: int) -> str:
    """A memory size for an error line: GiB, or MiB below one GiB."""
    return f"{n_bytes / 2**30:,.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:,.1f} MiB"


def search_settings(
    path: str, saved: SearchConfig, overrides: dict[str, Any], is_parser: bool, bounds: SearchBounds
) -> SearchConfig:
    """The checkpoint's search settings (`saved`) with the options given; refuse options the search would
    ignore, and sizes that cannot fit in `bounds`' device memory. `path` names the checkpoint in errors."""
    search = replace(saved, **overrides)
    sampling_only = [flag_name(k) for k in SAMPLING_FIELDS if k in overrides]
    if sampling_only and not search.sampling:
        raise ConfigError(
            f"--sampling is off, so {' and '.join(sampling_only)} would be ignored; add --sampling or drop them"
        )
    if search.sampling and "beam" in overrides and search.beam > 1:
        raise ConfigError(
            f"--sampling draws one token at a time, so --beam {search.beam} would be ignored; "
            f"for {search.beam} samples of each sentence give --nbest {search.beam}"
        )
    ngram = search.no_repeat_ngram_size
    for refused, why in (
        (
            search.min_len != saved.min_len,
            f"a tree's length follows its sentence's words, so --min-len {search.min_len}",
        ),
        (ngram, f"a tree repeats its brackets and tags, so --no-repeat-ngram-size {ngram}"),
        (search.nbest > 1, f"it writes its best tree per sentence, so --nbest {search.nbest}"),
    ):
        if is_parser and refused:
            raise ConfigError(f"{path} is a parsing model: {why} cannot apply; drop it")
    search_batch_size(search, bounds, 1, batch_size=0, have=available_memory(bounds.device))  # a one-piece sentence
    return search


def generation_precision(precision: str | None, device: torch.device, trained: str | None) -> str:
    """--precision, else the checkpoint's training precision (`trained`) on CUDA; fp32 on CPU (its fastest float
    path)."""
    if precision is None:
        precision = trained if device.type == "cuda" else "fp32"
    return resolve_precision(device, precision, work="inference")
