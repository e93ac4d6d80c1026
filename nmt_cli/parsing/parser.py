"""A parsing checkpoint's search: sentences in, bracketed trees out (`TreeParser`; generate, serve and plot
attention all parse through it).

Each sentence is split on whitespace into words written as the treebank writes them (brackets as
-LRB- -RRB- -LSB- -RSB- -LCB- -RCB-, also inside a word: `ptb_words`, which keeps the output's brackets
balanced); the words are encoded with the checkpoint's sentencepiece model, searched under the tree
constraint (constraint.py) with exactly as many leaves as words, and the best hypothesis is turned back
into a tree holding those words (`(TOP ...)`, EVALB's gold format); punctuation words, the escaped
brackets among them, get their fixed tag (linearize.tag_punctuation). A sentence without words gets no tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.data import WORD_MARK
from nmt_cli.data.vocab import EOS, PAD, Vocab
from nmt_cli.parsing.constraint import TreeConstraint
from nmt_cli.parsing.copy_constraint import CopyingTreeConstraint
from nmt_cli.parsing.linearize import (
    BRACKET_ESCAPES,
    CLOSE,
    COPY_MODES,
    SLOT,
    TOP,
    delinearize,
    is_open,
    piece_token,
    tag_punctuation,
    with_top,
)
from nmt_cli.parsing.tree import Tree
from nmt_cli.search.beam import max_lengths
from nmt_cli.search.translate import Translator, translate

PTB_ESCAPES = str.maketrans(BRACKET_ESCAPES)


def ptb_words(line: str) -> list[str]:
    """A tokenised sentence's words as the treebank (and so the parser's training data) writes them."""
    return line.translate(PTB_ESCAPES).split()


def tree_tokens(vocab: Vocab) -> list[str]:
    """The tree token of every id ("" for a text piece): tree tokens are the vocabulary's control symbols
    after EOS, spelt `<TOKEN>` (parsing/preprocess.py puts them there; linearize.piece_token)."""
    sp = vocab.sp
    return [piece_token(sp.id_to_piece(i)) if i > EOS and sp.is_control(i) else "" for i in range(vocab.n_pieces)]


def tree_constraint(vocab: Vocab, vocab_size: int) -> TreeConstraint:
    tokens = tree_tokens(vocab)
    leaves = [t for t in tokens if t and not is_open(t) and t != CLOSE]
    return TreeConstraint.from_pieces(tokens, leaves, vocab_size)


def flat_tree(words: Sequence[str]) -> Tree:
    """The fallback when no tree fits the length limit: every word under one S, punctuation tagged as the
    treebank tags it (EVALB drops punctuation by its tag: an XX comma would make the sentence an error)."""
    return tag_punctuation(Tree(TOP, [Tree("S", [Tree(SLOT, word=w) for w in words])]))


def word_starts(vocab: Vocab) -> Tensor:
    """[padded vocabulary] True at the text pieces that begin a word (sentencepiece's ▁)."""
    starts = torch.zeros(vocab.padded_size, dtype=torch.bool)
    for i in range(EOS + 1, vocab.n_pieces):
        starts[i] = not vocab.sp.is_control(i) and vocab.sp.id_to_piece(i).startswith(WORD_MARK)
    return starts


@dataclass
class TreeSearch:
    """The parser's rules for `translate` (search/translate.py's SearchConstraint): the tree constraint, each
    sentence's word count (its leaves), and for trees that copy their words (`starts` given) the copying."""

    constraint: TreeConstraint
    n_words: Sequence[int]
    starts: Tensor | None = None
    ahead: bool = False

    def for_batch(
        self, src: Tensor, src_lens: Tensor, ids: np.ndarray
    ) -> tuple[TreeConstraint | CopyingTreeConstraint, Tensor]:
        n_leaves = torch.tensor([self.n_words[i] for i in ids], device=src.device)
        if self.starts is None:
            return self.constraint, n_leaves
        pieces = src.masked_fill(src.eq(EOS), PAD)
        lengths = src_lens.to(src.device)
        return CopyingTreeConstraint(self.constraint, pieces, lengths, self.starts, self.ahead), n_leaves


@dataclass
class TreeParser:
    """A parsing checkpoint's search, built once: the tree constraint, the tree token of every id, and for
    `--tree-leaves words` the pieces that begin a word. generate, serve and plot attention all parse through it."""

    tr: Translator
    constraint: TreeConstraint
    tokens_of: list[str]
    starts: Tensor | None
    ahead: bool = False  # words-ahead: each word is copied right after the previous tag

    @classmethod
    def of(cls, tr: Translator, leaves: str | None) -> TreeParser:
        """leaves: the checkpoint's --tree-leaves ("words", "words-ahead": its trees copy their words,
        copy_constraint.py)."""
        starts = word_starts(tr.vocab) if leaves in COPY_MODES else None
        constraint = tree_constraint(tr.vocab, tr.vocab.padded_size)
        return cls(tr, constraint, tree_tokens(tr.vocab), starts, leaves == "words-ahead")

    def rules(self, n_words: Sequence[int]) -> TreeSearch:
        """The search's rules for sentences of these word counts (in the order they are given to the search)."""
        return TreeSearch(self.constraint, n_words, self.starts, self.ahead)

    def parse(
        self,
        words: list[list[str]],
        cfg: SearchConfig,
        max_tokens: int,
        batch_size: int,
        generator: torch.Generator | None = None,
    ) -> tuple[list[Tree | None], int]:
        """Trees for tokenised sentences, in input order (None for an empty one); also the fallback count.
        Sampling (cfg.sampling) draws from `generator`, one for every chunk of a run (`sampling_generator`)."""
        tr, starts = self.tr, self.starts
        limit = tr.model.max_positions - 1
        sources = [np.asarray(ids[:limit], dtype=np.int64) for ids in tr.vocab.encode([" ".join(w) for w in words])]
        src_lens = torch.tensor([len(s) for s in sources])
        need = [len(w) + 2 + (len(s) if starts is not None else 0) for w, s in zip(words, sources)]
        fits = max_lengths(src_lens, cfg, tr.model.max_positions) >= torch.tensor(need)
        if starts is not None:  # and the pieces make one word per word (not so when cut to the model's positions)
            fits &= torch.tensor([int(starts[torch.from_numpy(s)].sum()) == len(w) for w, s in zip(words, sources)])
        trees: list[Tree | None] = [None if not w else flat_tree(w) for w in words]
        todo = np.flatnonzero(np.array([bool(w) for w in words]) & fits.numpy())
        n_fallback = sum(1 for i, w in enumerate(words) if w and not bool(fits[i]))
        rules = self.rules([len(words[i]) for i in todo])
        results = translate(tr, [sources[i] for i in todo], cfg, max_tokens, batch_size, generator, rules)
        for i, hyps in zip(todo, results):
            try:  # (copied pieces are no tree tokens)
                tree = delinearize([self.tokens_of[t] for t in hyps[0].tokens if self.tokens_of[t]], words[i])
                trees[i] = with_top(tag_punctuation(tree))
            except ValueError:  # the constraint rules this out; keep the output usable if it ever fails
                n_fallback += 1
        return trees, n_fallback
