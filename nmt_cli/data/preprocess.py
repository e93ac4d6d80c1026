"""`nmt preprocess`: check the text, train the joint SentencePiece model, binarize every split.

Everything is written into a temporary directory beside --destdir and renamed at the end, so a
failed or interrupted run never leaves a half-written data directory.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from nmt_cli import __version__
from nmt_cli.config import PreprocessConfig, named_values
from nmt_cli.data import WORD_MARK
from nmt_cli.data.binarize import TokenWriter, check_text_file, file_sha256, read_pairs, token_dtype
from nmt_cli.data.dataset import META_FILE, META_FORMAT_VERSION, SPM_FILE, TRAIN
from nmt_cli.data.vocab import Vocab, train_spm
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.files import directory_in_place
from nmt_cli.log import progress

logger = logging.getLogger(__name__)

CHUNK_SIZE = 10_000


def split_prefixes(cfg: PreprocessConfig) -> dict[str, str]:
    """Map split names to text prefixes: train (or train.NAME for each named corpus), valid, test, test1, ..."""
    splits = {TRAIN: cfg.trainpref}
    if "=" in cfg.trainpref:
        named = named_values("--trainpref", cfg.trainpref)
        bad = [name for name in named if not re.fullmatch(r"[\w-]+", name, re.ASCII)]
        if bad:
            raise ConfigError(f"--trainpref: the corpus name {bad[0]!r} may hold only letters, digits, - and _")
        splits = {f"{TRAIN}.{name}": prefix for name, prefix in named.items()}
    if cfg.validpref:
        splits["valid"] = cfg.validpref
    prefixes = cfg.testpref.split(",") if cfg.testpref else []
    if "" in prefixes:  # "a,,b" would skip the gap: b would become test1, not the test2 its place says
        raise ConfigError(f"--testpref {cfg.testpref!r} has an empty prefix; separate the prefixes with single commas")
    for i, prefix in enumerate(prefixes):
        splits["test" if i == 0 else f"test{i}"] = prefix
    return splits


def check_inputs(cfg: PreprocessConfig, splits: dict[str, str]) -> dict[str, int]:
    """Every file exists and is UTF-8, and source and target have equal line counts."""
    n_lines = {}
    for split, prefix in splits.items():
        src_path = Path(f"{prefix}.{cfg.source_lang}")
        tgt_path = Path(f"{prefix}.{cfg.target_lang}")
        n_src, n_tgt = check_text_file(src_path), check_text_file(tgt_path)
        if n_src != n_tgt:
            raise DataError(
                f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; parallel files must have equal line counts"
            )
        if n_src == 0:
            raise DataError(f"{src_path} and {tgt_path} are empty")
        n_lines[split] = n_src
        if is_train(split):
            warn_if_subword_split(src_path)
            warn_if_subword_split(tgt_path)
    return n_lines


# What already-split text looks like: sentencepiece's word marker, subword-nmt's continuation marker.
SUBWORD_MARKS = {WORD_MARK: f"sentencepiece pieces ({WORD_MARK})", "@@ ": "subword-nmt BPE (@@ )"}


def warn_if_subword_split(path: Path, sample: int = 1000) -> None:
    """Warn when most of the first `sample` lines are already split into subwords (fairseq's preprocess takes
    BPE'd text; nmt trains its own sentencepiece model on raw text, and outputs would keep the marks)."""
    with path.open(encoding="utf-8") as f:
        lines = [line for _, line in zip(range(sample), f) if line.strip()]
    for mark, name in SUBWORD_MARKS.items():
        n = sum(mark in line for line in lines)
        if lines and n > len(lines) / 2:
            logger.warning(
                "%s: %d of its first %d lines hold %s; preprocess wants raw text (it trains its own "
                "sentencepiece model), else translations keep those marks",
                path,
                n,
                len(lines),
                name,
            )


def keep_pair(src: list[int], tgt: list[int], max_len: int, max_ratio: float) -> str | None:
    """None to keep a training pair, else the reason it is dropped."""
    if not src or not tgt:
        return "empty"
    if len(src) > max_len or len(tgt) > max_len:
        return "too_long"
    if max(len(src), len(tgt)) > max_ratio * min(len(src), len(tgt)):
        return "ratio"
    return None


def binarize_split(
    cfg: PreprocessConfig, vocab: Vocab, split: str, prefix: str, n_lines: int, out_dir: Path
) -> dict[str, Any]:
    """Encode one split; train is filtered by length and ratio, other splits are kept line for line."""
    dtype = token_dtype(vocab.padded_size)
    langs = (cfg.source_lang, cfg.target_lang)
    writers = [TokenWriter(out_dir / f"{split}.{lang}", dtype) for lang in langs]
    dropped = {"empty": 0, "too_long": 0, "ratio": 0}
    with progress() as bar:
        task = bar.add_task(f"binarize {split}", total=n_lines, info="")
        for src_lines, tgt_lines in read_pairs(Path(f"{prefix}.{langs[0]}"), Path(f"{prefix}.{langs[1]}"), CHUNK_SIZE):
            src_ids = vocab.encode(src_lines, cfg.workers)
            tgt_ids = vocab.encode(tgt_lines, cfg.workers)
            if is_train(split):
                reasons = [keep_pair(s, t, cfg.max_len, cfg.max_len_ratio) for s, t in zip(src_ids, tgt_ids)]
                for r in reasons:
                    if r:
                        dropped[r] += 1
                src_ids = [s for s, r in zip(src_ids, reasons) if r is None]
                tgt_ids = [t for t, r in zip(tgt_ids, reasons) if r is None]
            writers[0].add(src_ids)
            writers[1].add(tgt_ids)
            bar.advance(task, len(src_lines))
    n_tokens = [w.finish() for w in writers]
    n_pairs = n_lines - sum(dropped.values())
    if is_train(split) and n_pairs == 0:
        raise DataError(
            f"every training pair of {prefix}.* was filtered out ({dropped}); "
            "check the files or raise --max-len / --max-len-ratio"
        )
    stats = {
        "lines": n_lines,
        "pairs": n_pairs,
        f"{langs[0]}_tokens": n_tokens[0],
        f"{langs[1]}_tokens": n_tokens[1],
        "dropped": dropped,
    }
    if is_train(split):
        logger.info(
            "%s: kept %d of %d pairs; dropped %d with an empty side, %d longer than %d pieces, "
            "%d with a length ratio over %.2f",
            split,
            n_pairs,
            n_lines,
            dropped["empty"],
            dropped["too_long"],
            cfg.max_len,
            dropped["ratio"],
            cfg.max_len_ratio,
        )
    else:
        logger.info("%s: %d pairs (never filtered)", split, n_pairs)
    return stats


def make_vocab(cfg: PreprocessConfig, out_dir: Path, splits: dict[str, str]) -> Vocab:
    """The joint vocabulary of every training corpus, with --tags last (or --spm-model, which must hold them)."""
    target = out_dir / SPM_FILE
    tags = list(named_values("--tags", cfg.tags, named=False))
    if cfg.spm_model:
        vocab = Vocab.load(Path(cfg.spm_model))
        if not set(tags) <= set(vocab.tags):
            raise DataError(
                f"--spm-model {cfg.spm_model} has the tags {vocab.tags or 'none'}, not all of --tags {cfg.tags}; "
                "let preprocess train one"
            )
        target.write_bytes(vocab.model_bytes)
        return vocab
    langs = (cfg.source_lang, cfg.target_lang)
    inputs = [Path(f"{prefix}.{lang}") for split, prefix in splits.items() if is_train(split) for lang in langs]
    logger.info(
        "training a joint %s sentencepiece model of %d pieces on %s",
        cfg.model_type,
        cfg.vocab_size,
        ", ".join(map(str, inputs)),
    )
    train_spm(
        inputs,
        out_dir / "spm",
        cfg.vocab_size,
        cfg.model_type,
        cfg.character_coverage,
        cfg.spm_train_sentences,
        cfg.workers,
        tags=tags,
    )
    return Vocab.load(target)


def is_train(split: str) -> bool:
    """A training corpus's split: filtered by length and ratio, and the vocabulary's text."""
    return split == TRAIN or split.startswith(f"{TRAIN}.")


def check_destdir(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise DataError(f"--destdir {dest} is a file, not a directory; remove it or choose another")
    if dest.is_dir() and any(dest.iterdir()):
        raise DataError(f"--destdir {dest} already exists and is not empty; remove it or choose another")


def file_checksums(directory: Path) -> dict[str, str]:
    """sha256 of every offsets file: a corrupted one would silently shift sentence boundaries."""
    return {p.name: file_sha256(p) for p in sorted(directory.glob("*.idx.npy"))}


# Writes a data directory's vocabulary and splits into the temporary directory; returns the vocabulary, each split's
# statistics and the task's own metadata (translation's: `text_contents`; parsing's: nmt_cli/parsing/preprocess.py).
Contents = Callable[[PreprocessConfig, Path], tuple[Vocab, dict[str, Any], dict[str, Any]]]


def preprocess(cfg: PreprocessConfig, contents: Contents | None = None) -> dict[str, Any]:
    """Build a data directory from raw parallel text (or what `contents` writes); returns its metadata."""
    if contents is None:
        if cfg.target_format != "text":
            raise ConfigError(
                f"--target-format {cfg.target_format} needs its own contents "
                "(nmt_cli.parsing.preprocess.preprocess_trees)"
            )
        splits = split_prefixes(cfg)
        n_lines = check_inputs(cfg, splits)
        contents = partial(text_contents, splits=splits, n_lines=n_lines)
    dest = Path(cfg.destdir)
    check_destdir(dest)
    return build(cfg, dest, contents)


def text_contents(
    cfg: PreprocessConfig, tmp: Path, splits: dict[str, str], n_lines: dict[str, int]
) -> tuple[Vocab, dict[str, Any], dict[str, Any]]:
    """Translation: a joint sentencepiece vocabulary, then every split encoded."""
    vocab = make_vocab(cfg, tmp, splits)
    stats = {split: binarize_split(cfg, vocab, split, prefix, n_lines[split], tmp) for split, prefix in splits.items()}
    return vocab, stats, {}


def build(cfg: PreprocessConfig, dest: Path, contents: Contents) -> dict[str, Any]:
    """Write everything into a temporary directory beside `dest`, then rename it to `dest` (`directory_in_place`)."""
    with directory_in_place(dest, "--destdir", "preprocess") as tmp:
        check_destdir(dest)  # again, now that no other preprocess can be writing it
        vocab, stats, task_meta = contents(cfg, tmp)
        vocab.write_vocab(tmp / "vocab.txt")
        meta = {
            "format_version": META_FORMAT_VERSION,
            "nmt_version": __version__,
            "source_lang": cfg.source_lang,
            "target_lang": cfg.target_lang,
            "n_pieces": vocab.n_pieces,
            "vocab_size": vocab.padded_size,
            "spm_sha256": vocab.sha256,
            "dtype": token_dtype(vocab.padded_size).name,
            "splits": stats,
            "checksums": file_checksums(tmp),
            "preprocess": asdict(cfg),
            **task_meta,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if dest.is_dir() and any(dest.iterdir()):  # checked empty at the start; files arrived since
            raise DataError(f"--destdir {dest} is no longer empty; nothing was written")
    logger.info("wrote %s (vocabulary of %d pieces, padded to %d)", dest, vocab.n_pieces, vocab.padded_size)
    return meta
