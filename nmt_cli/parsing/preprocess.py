"""`nmt preprocess --target-format ptb-tree`: sentences in, linearised trees out, binarized like translation data.

The target file holds one bracketed tree per line; the optional source file (its words) must match the trees'
words. Trees are cleaned (tree.clean) and linearised (linearize.py). Every tree token (`(NP`, `)`, a tag or XX) is a
sentencepiece control symbol spelt `<TOKEN>` (linearize.token_piece): one id each, never produced when encoding
text. Sentencepiece is trained on the source words only (--character-coverage 1 gives each of their characters a
piece)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from nmt_cli.config import PreprocessConfig
from nmt_cli.data import WORD_MARK, split_lines
from nmt_cli.data.binarize import TokenWriter, check_text_file, token_dtype
from nmt_cli.data.dataset import SPM_FILE
from nmt_cli.data.preprocess import preprocess, split_prefixes
from nmt_cli.data.vocab import UNK, Vocab, train_spm
from nmt_cli.errors import DataError
from nmt_cli.parsing.linearize import CLOSE, COPY_MODES, is_open, linearize, token_piece
from nmt_cli.parsing.tree import TreeSyntaxError, clean, parse_tree

logger = logging.getLogger(__name__)

Example = tuple[list[str], list[str]]  # (words, tree tokens)
RESERVED_PIECES = frozenset({"<pad>", "<unk>", "<s>", "</s>"})  # pad, unk, bos, eos (data/vocab.py's ids 0-3)


def read_examples(tree_path: Path, words_path: Path | None, leaves: str) -> list[Example]:
    """Parse, check and linearise one split; DataError names the file and line of the first problem."""
    check_text_file(tree_path)
    words_lines = None
    if words_path is not None:
        check_text_file(words_path)
        words_lines = split_lines(words_path.read_text(encoding="utf-8"))
    tree_lines = split_lines(tree_path.read_text(encoding="utf-8"))
    if words_lines is not None and len(words_lines) != len(tree_lines):
        raise DataError(
            f"{words_path} has {len(words_lines)} lines but {tree_path} has {len(tree_lines)}; "
            "each sentence needs its tree on the same line"
        )
    if not tree_lines:
        raise DataError(f"{tree_path} is empty")
    examples = []
    for n, line in enumerate(tree_lines, start=1):
        try:
            tree = clean(parse_tree(line))
        except TreeSyntaxError as e:
            raise DataError(f"{tree_path}:{n}: {e}") from None
        if tree is None:
            raise DataError(f"{tree_path}:{n}: the tree has no words (only -NONE- elements)")
        words = tree.words()
        given = words_lines[n - 1].split() if words_lines is not None else words
        if given != words:
            at = next((i for i, (a, b) in enumerate(zip(given, words)) if a != b), min(len(given), len(words)))
            differ = (
                f"word {at + 1} is {given[at]!r}, the tree's leaf {words[at]!r}"
                if at < min(len(given), len(words))
                else f"{len(given)} words vs {len(words)} leaves"
            )
            raise DataError(f"{words_path}:{n}: the words do not match the tree's in {tree_path}:{n} ({differ})")
        tokens = linearize(tree, leaves)
        reserved = sorted(t for t in tokens if token_piece(t) in RESERVED_PIECES)
        if reserved:  # the tag would be read as that special id (</s> ends the tree)
            raise DataError(
                f"{tree_path}:{n}: the tag {reserved[0]} is spelt {token_piece(reserved[0])} in the vocabulary, "
                "one of sentencepiece's special pieces"
            )
        examples.append((words, tokens))
    return examples


def tree_vocab(cfg: PreprocessConfig, examples: dict[str, list[Example]], out_dir: Path) -> Vocab:
    """Train sentencepiece on the training words with every tree token as a control symbol (or reuse one)."""
    symbols = sorted({token_piece(tok) for split in examples.values() for _, tokens in split for tok in tokens})
    if cfg.spm_model:
        vocab = Vocab.load(Path(cfg.spm_model))
        missing = [s for s in symbols if not vocab.sp.is_control(vocab.sp.piece_to_id(s))]
        if missing:
            raise DataError(
                f"--spm-model {cfg.spm_model} lacks the tree tokens {missing[:5]} (as control symbols); "
                "let preprocess train one"
            )
        (out_dir / SPM_FILE).write_bytes(vocab.model_bytes)
        return vocab
    text = out_dir / "spm-train.txt"
    text.write_text("".join(" ".join(w) + "\n" for w, _ in examples["train"]), encoding="utf-8")
    logger.info(
        "training a %s sentencepiece model of %d pieces on the training words (%d tree tokens as control symbols)",
        cfg.model_type,
        cfg.vocab_size,
        len(symbols),
    )
    train_spm(
        [text],
        out_dir / "spm",
        cfg.vocab_size,
        cfg.model_type,
        cfg.character_coverage,
        cfg.spm_train_sentences,
        cfg.workers,
        control_symbols=symbols,
    )
    text.unlink()
    return Vocab.load(out_dir / SPM_FILE)


def word_spans(vocab: Vocab, ids: list[int]) -> list[list[int]]:
    """A sentence's pieces grouped by word: a word begins with a piece that begins with ▁."""
    words: list[list[int]] = []
    for i in ids:
        if vocab.sp.id_to_piece(i).startswith(WORD_MARK) or not words:
            words.append([])
        words[-1].append(i)
    return words


def with_words(vocab: Vocab, src: list[int], tokens: list[str], where: str, ahead: bool = False) -> list[int]:
    """Tree token ids with each word's pieces put before its leaf (`--tree-leaves words`), or (ahead:
    `words-ahead`) right after the previous leaf, the first word's at the start (copy_constraint.py)."""
    words = word_spans(vocab, src)
    n_leaves = sum(1 for t in tokens if not is_open(t) and t != CLOSE)
    if len(words) != n_leaves:
        raise DataError(f"{where}: the sentence's pieces make {len(words)} words, its tree has {n_leaves} leaves")
    spans = iter(words)
    out: list[int] = next(spans) if ahead else []
    for tok in tokens:
        leaf = not is_open(tok) and tok != CLOSE
        if leaf and not ahead:
            out += next(spans)
        out.append(vocab.sp.piece_to_id(token_piece(tok)))
        if leaf and ahead:
            out += next(spans, [])
    return out


def binarize_trees(
    cfg: PreprocessConfig, vocab: Vocab, split: str, examples: list[Example], out_dir: Path
) -> dict[str, Any]:
    """Source: sentencepiece ids of the words; target: one id per tree token. Train drops over-long pairs."""
    dtype = token_dtype(vocab.padded_size)
    writers = [TokenWriter(out_dir / f"{split}.{lang}", dtype) for lang in (cfg.source_lang, cfg.target_lang)]
    src_ids = vocab.encode([" ".join(words) for words, _ in examples], cfg.workers)
    tgt_ids = [[vocab.sp.piece_to_id(token_piece(tok)) for tok in tokens] for _, tokens in examples]
    if cfg.tree_leaves in COPY_MODES:
        tgt_ids = [
            with_words(vocab, s, tokens, f"{split} tree {n}", ahead=cfg.tree_leaves == "words-ahead")
            for n, (s, (_, tokens)) in enumerate(zip(src_ids, examples), start=1)
        ]
    n_unk = sum(ids.count(UNK) for ids in src_ids)
    if n_unk:  # characters the vocabulary cannot spell (a --spm-model trained elsewhere, or unseen ones)
        logger.warning("%s: %d of the words' %d pieces are <unk>", split, n_unk, sum(map(len, src_ids)))
    keep = [split != "train" or (len(s) <= cfg.max_len and len(t) <= cfg.max_len) for s, t in zip(src_ids, tgt_ids)]
    writers[0].add([s for s, k in zip(src_ids, keep) if k])
    writers[1].add([t for t, k in zip(tgt_ids, keep) if k])
    n_tokens = [w.finish() for w in writers]
    dropped = len(examples) - sum(keep)
    logger.info(
        "%s: %d sentences with trees%s",
        split,
        sum(keep),
        f" (dropped {dropped} longer than {cfg.max_len})" if dropped else "",
    )
    return {
        "lines": len(examples),
        "pairs": sum(keep),
        f"{cfg.source_lang}_tokens": n_tokens[0],
        f"{cfg.target_lang}_tokens": n_tokens[1],
        "dropped": {"empty": 0, "too_long": dropped, "ratio": 0},
    }


def preprocess_trees(cfg: PreprocessConfig) -> dict[str, Any]:
    """Build a data directory of (sentence, linearised tree) pairs; returns its metadata."""
    examples = {}
    for split, prefix in split_prefixes(cfg).items():  # read and checked before anything is written
        words_path = Path(f"{prefix}.{cfg.source_lang}")
        examples[split] = read_examples(
            Path(f"{prefix}.{cfg.target_lang}"), words_path if words_path.exists() else None, cfg.tree_leaves
        )
    return preprocess(cfg, partial(tree_contents, examples=examples))


def tree_contents(
    cfg: PreprocessConfig, tmp: Path, examples: dict[str, list[Example]]
) -> tuple[Vocab, dict[str, Any], dict[str, Any]]:
    """The tree-token vocabulary and every split's (sentence, tree tokens) pairs, written into `tmp`."""
    vocab = tree_vocab(cfg, examples, tmp)
    stats = {split: binarize_trees(cfg, vocab, split, ex, tmp) for split, ex in examples.items()}
    leaf_tokens = sorted(
        {t for ex in examples.values() for _, toks in ex for t in toks if not t.startswith("(") and t != ")"}
    )
    logger.info(
        "%d pieces, %d of them tree tokens",
        vocab.n_pieces,
        sum(1 for i in range(vocab.n_pieces) if vocab.sp.is_control(i)) - 3,
    )
    return vocab, stats, {"target_format": "ptb-tree", "tree_leaves": cfg.tree_leaves, "leaf_tokens": leaf_tokens}
