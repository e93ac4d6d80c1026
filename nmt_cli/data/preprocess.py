"""`nmt preprocess`: check the text, train the joint SentencePiece model, binarize every split.

Everything is written into a temporary directory beside --destdir and renamed at the end, so a
failed or interrupted run never leaves a half-written data directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nmt_cli import __version__
from nmt_cli.config import PreprocessConfig
from nmt_cli.data.binarize import TokenWriter, check_text_file, read_pairs, token_dtype
from nmt_cli.data.dataset import META_FILE, SPM_FILE
from nmt_cli.data.vocab import Vocab, train_spm
from nmt_cli.errors import DataError
from nmt_cli.log import progress

logger = logging.getLogger(__name__)

CHUNK_SIZE = 10_000


def split_prefixes(cfg: PreprocessConfig) -> dict[str, str]:
    """Map split names to text prefixes: train, valid, test, test1, test2, ..."""
    splits = {"train": cfg.trainpref}
    if cfg.validpref:
        splits["valid"] = cfg.validpref
    for i, prefix in enumerate(p for p in (cfg.testpref or "").split(",") if p):
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
            raise DataError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
                            "parallel files must have equal line counts")
        if n_src == 0:
            raise DataError(f"{src_path} and {tgt_path} are empty")
        n_lines[split] = n_src
    return n_lines


def keep_pair(src: list[int], tgt: list[int], max_len: int, max_ratio: float) -> str | None:
    """None to keep a training pair, else the reason it is dropped."""
    if not src or not tgt:
        return "empty"
    if len(src) > max_len or len(tgt) > max_len:
        return "too_long"
    if max(len(src), len(tgt)) > max_ratio * min(len(src), len(tgt)):
        return "ratio"
    return None


def binarize_split(cfg: PreprocessConfig, vocab: Vocab, split: str, prefix: str, n_lines: int,
                   out_dir: Path) -> dict[str, Any]:
    """Encode one split; train is filtered by length and ratio, other splits are kept line for line."""
    dtype = token_dtype(vocab.padded_size)
    langs = (cfg.source_lang, cfg.target_lang)
    writers = [TokenWriter(out_dir / f"{split}.{lang}", dtype) for lang in langs]
    dropped = {"empty": 0, "too_long": 0, "ratio": 0}
    with progress() as bar:
        task = bar.add_task(f"binarize {split}", total=n_lines, info="")
        for src_lines, tgt_lines in read_pairs(Path(f"{prefix}.{langs[0]}"), Path(f"{prefix}.{langs[1]}"),
                                               CHUNK_SIZE):
            src_ids = vocab.encode(src_lines, cfg.workers)
            tgt_ids = vocab.encode(tgt_lines, cfg.workers)
            if split == "train":
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
    if split == "train" and n_pairs == 0:
        raise DataError(f"every training pair of {prefix}.* was filtered out ({dropped}); "
                        "check the files or raise --max-len / --max-len-ratio")
    stats = {"lines": n_lines, "pairs": n_pairs, f"{langs[0]}_tokens": n_tokens[0],
             f"{langs[1]}_tokens": n_tokens[1], "dropped": dropped}
    if split == "train":
        logger.info("train: kept %d of %d pairs; dropped %d with an empty side, %d longer than %d pieces, "
                    "%d with a length ratio over %.2f", n_pairs, n_lines, dropped["empty"],
                    dropped["too_long"], cfg.max_len, dropped["ratio"], cfg.max_len_ratio)
    else:
        logger.info("%s: %d pairs (never filtered)", split, n_pairs)
    return stats


def make_vocab(cfg: PreprocessConfig, out_dir: Path) -> Vocab:
    target = out_dir / SPM_FILE
    if cfg.spm_model:
        vocab = Vocab.load(Path(cfg.spm_model))
        target.write_bytes(vocab.model_bytes)
        return vocab
    inputs = [Path(f"{cfg.trainpref}.{lang}") for lang in (cfg.source_lang, cfg.target_lang)]
    logger.info("training a joint %s sentencepiece model of %d pieces on %s", cfg.model_type,
                cfg.vocab_size, ", ".join(map(str, inputs)))
    train_spm(inputs, out_dir / "spm", cfg.vocab_size, cfg.model_type, cfg.character_coverage,
              cfg.spm_train_sentences, cfg.workers)
    return Vocab.load(target)


def make_temp_dir(dest: Path) -> Path:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise DataError(f"--destdir {dest} already exists and is not empty; remove it or choose another")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as e:
        raise DataError(f"cannot write --destdir {dest}: {e.strerror}") from None


def preprocess(cfg: PreprocessConfig) -> dict[str, Any]:
    """Build a data directory from raw parallel text; returns its metadata."""
    if cfg.target_format == "ptb-tree":  # sentences -> linearised trees (nmt_cli/parsing/preprocess.py)
        from nmt_cli.parsing.preprocess import preprocess_trees

        return preprocess_trees(cfg)
    splits = split_prefixes(cfg)
    n_lines = check_inputs(cfg, splits)
    dest = Path(cfg.destdir)
    tmp = make_temp_dir(dest)
    try:
        vocab = make_vocab(cfg, tmp)
        vocab.write_vocab(tmp / "vocab.txt")
        stats = {split: binarize_split(cfg, vocab, split, prefix, n_lines[split], tmp)
                 for split, prefix in splits.items()}
        meta = {"nmt_version": __version__, "source_lang": cfg.source_lang, "target_lang": cfg.target_lang,
                "n_pieces": vocab.n_pieces, "vocab_size": vocab.padded_size,
                "dtype": token_dtype(vocab.padded_size).name, "splits": stats, "preprocess": asdict(cfg)}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if dest.exists():
            dest.rmdir()
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp creates 0700
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %s (vocabulary of %d pieces, padded to %d)", dest, vocab.n_pieces, vocab.padded_size)
    return meta
