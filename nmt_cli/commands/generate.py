"""`nmt generate`'s input and output: pick the input (a binarized split or raw text, whole or one shard),
translate it with the search driver (search/translate.py), and write the records in input order; with a parsing
checkpoint, parse raw sentences (parsing/parser.py) into one bracketed tree per line."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from nmt_cli.commands.parse_trees import check_parse_request, generate_trees
from nmt_cli.commands.side_lines import (
    SideLines,
    buffer_size_of,
    input_name,
    open_input,
    open_with_side_files,
    read_lines,
    rules_beside,
    shard_range,
)
from nmt_cli.config import GenerateConfig, SearchConfig
from nmt_cli.data.dataset import load_meta, load_vocab
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.files import TMP_SUFFIX, atomic_text_output, remove_abandoned_temporaries, require_file
from nmt_cli.flags import changed_flags
from nmt_cli.runtime import set_threads
from nmt_cli.search.forced import add_alignments, alignment_layer
from nmt_cli.search.hypothesis import NOTHING_FOUND, Hypothesis, hypothesis_record
from nmt_cli.search.rules import OPTIONS, SentenceRules
from nmt_cli.search.settings import available_memory, search_batch_size
from nmt_cli.search.translate import (
    SearchRequest,
    Summary,
    Translator,
    open_for_inference,
    sampling_generator,
    translate,
)

# Sentences of a DATA_DIR split translated (and written) at a time: memory bounded and output steady on a
# training set of millions (distillation, back-translation) instead of every hypothesis held to the end.
SPLIT_CHUNK = 10_000

logger = logging.getLogger(__name__)

# Sets the alignment of each hypothesis of a chunk's results, given the chunk's sources (--print-alignment).
Aligner = Callable[[Sequence[np.ndarray], Sequence[Sequence[Hypothesis]]], None]
# The sentences a batch of sources of up to N pieces may hold (settings.search_batch_size).
BatchSize = Callable[[int], int]
Results = list[list[Hypothesis]]  # each source's hypotheses


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
    num_shards, shard_id = check_request(cfg)
    set_threads(cfg.threads)
    inference = open_for_inference(cfg, search_overrides or {}, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    saved, search = inference.saved, inference.search
    if cfg.data_dir is not None:
        data_dir = Path(cfg.data_dir)
        meta = load_meta(data_dir)
        saved.check_same_data(data_dir, meta, load_vocab(data_dir, meta).model_bytes)
    if saved.is_parser:
        check_parse_request(cfg)
    for rule in (o for o in OPTIONS if o.name in dict(cfg.rule_files)):
        if problem := rule.problem(search, cfg.path if saved.is_parser else None):
            raise ConfigError(f"{rule.file_option} {problem}")
    translator = inference.translator()
    # a batch's sentences: --batch-size, lowered so that its rows fit in the memory the search has before it starts
    have = available_memory(translator.device)
    batch_size = partial(search_batch_size, search, inference.bounds, batch_size=cfg.batch_size, have=have)
    with ExitStack() as stack:
        out = open_output(cfg, stack, num_shards, shard_id)
        if saved.is_parser:  # one bracketed tree per input line (nmt_cli/parsing)
            raw_lines, first_line, _ = open_input(cfg.input, stack, num_shards, shard_id)
            name = input_name(cfg)
            lines = read_lines(raw_lines, buffer_size_of(cfg), name, first_line)
            summary = generate_trees(
                translator, lines, search=search, max_tokens=cfg.max_tokens, batch_size=batch_size, out=out,
                leaves=saved.tree_leaves, source=(name, first_line),
            )  # fmt: skip
        else:
            align = aligner(cfg, translator, min(m.config.decoder_layers for m in inference.members))
            fmt = cfg.output_format or ("fairseq" if cfg.data_dir else "plain")
            generator = sampling_generator(search, translator.device)  # one for every chunk
            run = Run(translator, search, cfg.max_tokens, batch_size, align, generator, fmt, out)
            if cfg.data_dir is not None:
                generate_split(run, Path(cfg.data_dir), cfg.gen_subset, (num_shards, shard_id))
            else:
                generate_text(run, *open_with_side_files(cfg, stack, num_shards, shard_id))
            summary = run.summary
    log_summary(summary, search)
    return summary


def aligner(cfg: GenerateConfig, translator: Translator, decoder_layers: int) -> Aligner | None:
    """What sets the alignment of each hypothesis (--print-alignment), or None."""
    if not cfg.print_alignment:
        return None
    layer = alignment_layer(cfg.alignment_layer, decoder_layers)
    hard = cfg.print_alignment == "hard"
    return partial(
        add_alignments, translator, hard=hard, layer=layer, max_tokens=cfg.max_tokens, batch_size=cfg.batch_size
    )


def check_request(cfg: GenerateConfig) -> tuple[int, int]:
    """Refuse what the inputs and options cannot do, before the checkpoint is read; (num_shards, shard_id)."""
    if (cfg.data_dir is None) == (cfg.input is None):
        raise ConfigError("give either DATA_DIR (with --gen-subset) or --input FILE|-, not both or neither")
    if cfg.input is not None and "--gen-subset" in changed_flags(cfg):
        raise ConfigError("--gen-subset picks a split of DATA_DIR; with --input the file itself is translated")
    if cfg.data_dir is not None and cfg.buffer_size is not None:
        raise ConfigError(
            f"--buffer-size is for --input (lines read at a time); a DATA_DIR split goes {SPLIT_CHUNK:,} "
            "sentences at a time"
        )
    num_shards, shard_id = resolve_shard(cfg)
    under_torchrun = num_shards > 1 and cfg.num_shards == 1  # each rank takes one shard
    if cfg.input == "-" and num_shards > 1:
        raise ConfigError(
            f"{'under torchrun every rank translates a shard, and ' if under_torchrun else '--num-shards: '}"
            "stdin cannot be split; give --input FILE or DATA_DIR"
        )
    if under_torchrun and cfg.results_path is None:
        raise ConfigError(
            "under torchrun every rank translates a shard, and all writing to stdout would mix their lines; give "
            "--results-path DIR (one file per shard, to concatenate in shard order)"
        )
    if cfg.input not in (None, "-"):
        require_file(Path(cfg.input), "--input")
    for rule in (o for o in OPTIONS if o.name in dict(cfg.rule_files) and cfg.input is None):
        raise ConfigError(f"{rule.file_option} is line-aligned with --input FILE|-, not DATA_DIR: {rule.line}")
    if cfg.input == "-" and sys.stdin is None:
        raise DataError("--input -: stdin is closed; pipe text in or give --input FILE")
    return num_shards, shard_id


def log_summary(summary: Summary, search: SearchConfig) -> None:
    if search.sampling:
        how = f"sampling, top-k {search.sampling_topk}, top-p {search.sampling_topp:g}, T {search.temperature:g}"
    else:
        how = f"beam {search.beam}, lenpen {search.lenpen:g} {search.lenpen_style}"
    logger.info(
        "translated %d sentences (%d tokens) in %.1f s: %.1f sentences/s, %.0f tokens/s (%s)",
        summary.n_sentences,
        summary.n_tokens,
        summary.seconds,
        summary.n_sentences / max(summary.seconds, 1e-9),
        summary.n_tokens / max(summary.seconds, 1e-9),
        how,
    )


def open_output(cfg: GenerateConfig, stack: ExitStack, num_shards: int, shard_id: int) -> TextIO:
    """stdout, or generate-SUBSET.txt (generate-FILE.txt, generate-stdin.txt for --input) under --results-path,
    written atomically (a failed run leaves none)."""
    if cfg.results_path is None:
        return sys.stdout
    results_path = Path(cfg.results_path)
    if results_path.exists() and not results_path.is_dir():
        raise DataError(f"--results-path {cfg.results_path} is a file; give a directory")
    try:
        results_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create --results-path {cfg.results_path}: {e.strerror}") from None
    remove_abandoned_temporaries(results_path, (f"generate-*.txt{TMP_SUFFIX}",))  # killed runs', of any input
    # named after what is translated, so that two input files translated into one directory do not collide
    source = cfg.gen_subset if cfg.data_dir else ("stdin" if cfg.input == "-" else Path(str(cfg.input)).name)
    name = f"generate-{source}"
    name += f".shard{shard_id}-of-{num_shards}.txt" if num_shards > 1 else ".txt"
    return stack.enter_context(atomic_text_output(results_path / name, "--results-path file"))


def format_record(
    i: int, hyps: list[Hypothesis], vocab: Vocab, fmt: str, source: str | None = None, reference: str | None = None
) -> str:
    """Output lines for one input. fairseq: S/T/H/D/P lines; scores are natural-log (nats)."""
    if fmt == "plain":
        return "\n".join(vocab.decode(h.tokens) for h in hyps)
    if fmt == "jsonl":
        return json.dumps(
            {"id": i, "source": source, "hypotheses": [hypothesis_record(h, vocab) for h in hyps]}, ensure_ascii=False
        )
    lines = []
    if source is not None:
        lines.append(f"S-{i}\t{source}")
    if reference is not None:
        lines.append(f"T-{i}\t{reference}")
    for h in hyps:
        lines.append(f"H-{i}\t{h.score:.4f}\t{' '.join(vocab.pieces(h.tokens))}")
        lines.append(f"D-{i}\t{h.score:.4f}\t{vocab.decode(h.tokens)}")
        lines.append(f"P-{i}\t{' '.join(f'{s:.4f}' for s in h.positional_scores)}")
        if h.alignment is not None:
            lines.append(f"A-{i}\t{h.alignment.text()}")
    return "\n".join(lines)


@dataclass
class Run:
    """How each chunk of a run is translated and written (the one sampling generator of every chunk, the aligner of
    --print-alignment), and what the chunks so far took."""

    translator: Translator
    search: SearchConfig
    max_tokens: int
    batch_size: BatchSize
    align: Aligner | None
    generator: torch.Generator | None
    fmt: str
    out: TextIO
    summary: Summary = field(default_factory=Summary)

    def translate(self, sources: list[np.ndarray], first_id: int, rules: tuple[SentenceRules, ...] = ()) -> Results:
        """A chunk's results (aligned to their sources where asked), from sentence number `first_id` on."""
        start = time.perf_counter()
        batch_size = self.batch_size(max(map(len, sources), default=0))
        request = SearchRequest(sources, self.search, self.max_tokens, batch_size, rules=rules)
        results = translate(self.translator, request, generator=self.generator)
        if self.align is not None:
            self.align(sources, results)
        self.summary.add(results, time.perf_counter() - start)
        if missed := [str(first_id + j) for j, hyps in enumerate(results) if not hyps[0].found]:
            logger.warning("sentence %s: %s", ", ".join(missed), NOTHING_FOUND)
        return results

    def write(self, records: Iterable[str]) -> None:
        for record in records:
            print(record, file=self.out)
        self.out.flush()


def generate_split(run: Run, data_dir: Path, subset: str, shard: tuple[int, int]) -> None:
    """Translate a binarized split (or one contiguous shard of it) SPLIT_CHUNK sentences at a time; write
    records in input order."""
    from nmt_cli.data.dataset import ParallelDataset

    data, vocab = ParallelDataset(data_dir, subset), run.translator.vocab
    ids = shard_range(len(data), *shard)
    for first in range(0, len(ids), SPLIT_CHUNK):  # a test set is one chunk; a training set (distillation) many
        chunk = ids[first : first + SPLIT_CHUNK]
        results = run.translate([data.src[i] for i in chunk], chunk.start)
        run.write(
            format_record(i, hyps, vocab, run.fmt, vocab.decode(data.src[i]), vocab.decode(data.tgt[i]))
            for i, hyps in zip(chunk, results)
        )


def generate_text(run: Run, chunks: Iterable[list[str]], sides: dict[str, SideLines]) -> None:
    """Translate raw text with the checkpoint's own sentencepiece model, one buffer (chunk) at a time, each line
    following its rules: its lines of the side files `sides` (--NAME-file by the rule's name, search/rules.py)."""
    first_id, vocab = 0, run.translator.vocab
    for chunk in chunks:
        sources = vocab.encode_arrays(chunk)
        results = run.translate(sources, first_id, rules_beside(sides, run.translator, sources, run.search))
        run.write(
            format_record(first_id + j, hyps, vocab, run.fmt, chunk[j] if run.fmt != "plain" else None)
            for j, hyps in enumerate(results)
        )
        first_id += len(chunk)
