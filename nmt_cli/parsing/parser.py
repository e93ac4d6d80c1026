"""A parsing checkpoint's search: sentences in, bracketed trees out (`TreeParser`; generate, serve and plot
attention all parse through it).

Each sentence is split on whitespace into words written as the treebank writes them (`ptb_words`: brackets
escaped, also inside a word), encoded with the checkpoint's sentencepiece model, searched under the tree constraint
(constraint.py) with as many leaves as words, and the best hypothesis is turned back into a tree of those words
(`(TOP ...)`, EVALB's gold format), punctuation given its fixed tag. An empty line gives an empty line.

A word that sentencepiece's normalisation removes entirely (U+200B, a mid-file U+FEFF, other format characters) has
no pieces: it is left out of the search and put back as an `(XX word)` leaf beside the word before it, so that the
tree keeps a leaf per input word, as EVALB needs; the run warns with the lines that held them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

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
from nmt_cli.search.beam import StillWanted, max_lengths
from nmt_cli.search.translate import SearchRequest, Translator, subset, translate

logger = logging.getLogger(__name__)

PTB_ESCAPES = str.maketrans(BRACKET_ESCAPES)


def ptb_words(line: str) -> list[str]:
    """A tokenised sentence's words as the treebank (and so the parser's training data) writes them."""
    return line.translate(PTB_ESCAPES).split()


def tree_tokens(vocab: Vocab) -> list[str]:
    """The tree token of every id ("" for a text piece): tree tokens are the vocabulary's control symbols
    after EOS, spelt `<TOKEN>` (parsing/preprocess.py puts them there; linearize.piece_token)."""
    sp = vocab.sp
    return [piece_token(sp.id_to_piece(i)) if i > EOS and sp.is_control(i) else "" for i in range(vocab.n_pieces)]


def flat_tree(words: Sequence[str]) -> Tree:
    """The fallback when no tree fits the length limit: every word under one S, punctuation tagged as the
    treebank tags it (EVALB drops punctuation by its tag: an XX comma would make the sentence an error)."""
    return tag_punctuation(Tree(TOP, [Tree("S", [Tree(SLOT, word=w) for w in words])]))


def has_pieces(vocab: Vocab, words: Sequence[Sequence[str]]) -> list[list[bool]]:
    """Whether each word of each sentence encodes to any piece (see the module's docstring)."""
    unique = sorted({w for ws in words for w in ws})
    empty = {w for w, ids in zip(unique, vocab.encode(unique)) if not ids}
    return [[w not in empty for w in ws] for ws in words]


def with_words_without_pieces(tree: Tree, words: Sequence[str], pieces: Sequence[bool]) -> Tree:
    """A tree over the words that have pieces -> the tree over all `words`: each word without pieces becomes an
    `(XX word)` leaf right after the leaf of the word before it, in its constituent (before the first leaf,
    where such words lead the sentence). Iterative, as Tree's own walks, for trees of any depth."""
    leading: list[str] = []
    after: list[list[str]] = []
    for word, has in zip(words, pieces):
        if has:
            after.append([])
        else:
            (after[-1] if after else leading).append(word)
    if not leading and not any(after):
        return tree
    index = {id(leaf): k for k, leaf in enumerate(tree.preterminals())}
    stack = [tree]
    while stack:
        node = stack.pop()
        children: list[Tree] = []
        for child in node.children:
            if child.is_preterminal:
                k = index[id(child)]
                children += [Tree(SLOT, word=w) for w in (leading if k == 0 else [])]
                children += [child, *(Tree(SLOT, word=w) for w in after[k])]
            else:
                children.append(child)
                stack.append(child)
        node.children = children
    return tree


@dataclass
class ParseNotes:
    """What `TreeParser.parse` did besides searching, for the run's warnings: the sentences (indices into its
    input, or line numbers once `add`ed up by a run) with words without pieces, and those that got the flat
    (S ...) tree, by cause."""

    no_pieces: list[int] = field(default_factory=list)  # words without pieces, left out of the search
    too_long: list[int] = field(default_factory=list)  # no tree within the maximum length
    split: list[int] = field(default_factory=list)  # a word's pieces are no single word (copying trees)
    invalid: list[int] = field(default_factory=list)  # the search's tokens were no tree over the words

    def add(self, other: ParseNotes, first: int) -> None:
        """Take another call's notes, its sentence 0 being number `first` here."""
        for kind in fields(self):
            getattr(self, kind.name).extend(first + i for i in getattr(other, kind.name))

    def warn(self, name: str) -> None:
        """Log each kind of note once, naming `name`'s lines (the numbers `add` gave)."""
        for lines, what in (
            (self.no_pieces, "hold word(s) that normalise to nothing (such as U+200B zero-width space or a U+FEFF "
             "byte-order mark), left out of the search: each got an (XX word) leaf beside the word before it"),
            (self.too_long, "had no tree within the maximum length (--max-len-a/--max-len-b or the model's "
             "positions): a flat (S ...) tree"),
            (self.split, "hold a word that sentencepiece splits into several (a character its normalisation turns "
             "into a space); a tree copies one word per word: a flat (S ...) tree"),
            (self.invalid, "got no well-formed tree from the search: a flat (S ...) tree"),
        ):  # fmt: skip
            if lines:
                logger.warning("%d sentence(s) %s (%s)", len(lines), what, line_list(name, lines))


def line_list(name: str, lines: Sequence[int], shown: int = 10) -> str:
    """`name line 3` or `name lines 3, 7, 9 and 12 more`."""
    text = ", ".join(str(n) for n in lines[:shown])
    more = f" and {len(lines) - shown} more" if len(lines) > shown else ""
    return f"{name} line{'s' if len(lines) > 1 else ''} {text}{more}"


def word_starts(vocab: Vocab) -> Tensor:
    """[padded vocabulary] True at the text pieces that begin a word (sentencepiece's ▁)."""
    starts = torch.zeros(vocab.padded_size, dtype=torch.bool)
    for i in range(EOS + 1, vocab.n_pieces):
        starts[i] = not vocab.sp.is_control(i) and vocab.sp.id_to_piece(i).startswith(WORD_MARK)
    return starts


@dataclass
class TreeConstraints:
    """The parser's ConstraintSource for `translate` (search/constraint.py): the tree constraint, each
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

    translator: Translator
    constraint: TreeConstraint
    tokens_of: list[str]
    starts: Tensor | None
    ahead: bool = False  # words-ahead: each word is copied right after the previous tag

    @classmethod
    def of(cls, translator: Translator, leaves: str | None) -> TreeParser:
        """leaves: the checkpoint's --tree-leaves ("words", "words-ahead": its trees copy their words,
        copy_constraint.py)."""
        starts = word_starts(translator.vocab) if leaves in COPY_MODES else None
        tokens = tree_tokens(translator.vocab)
        leaf_tokens = [t for t in tokens if t and not is_open(t) and t != CLOSE]
        constraint = TreeConstraint.from_pieces(tokens, leaf_tokens, translator.vocab.padded_size)
        return cls(translator, constraint, tokens, starts, leaves == "words-ahead")

    def constraints(self, n_words: Sequence[int]) -> TreeConstraints:
        """The search's constraints for sentences of these word counts (in the order they are given to the search)."""
        return TreeConstraints(self.constraint, n_words, self.starts, self.ahead)

    def parse(
        self,
        words: list[list[str]],
        cfg: SearchConfig,
        max_tokens: int,
        batch_size: int,
        generator: torch.Generator | None = None,
        still_wanted: StillWanted | None = None,
    ) -> tuple[list[Tree | None], ParseNotes]:
        """Trees for tokenised sentences, in input order (None for an empty one); also what the caller warns of.
        Sampling (cfg.sampling) draws from `generator`, one for every chunk of a run (`sampling_generator`).
        Words without pieces are searched without and get an (XX word) leaf (see the module's docstring); a
        sentence of such words only is not searched and gets the flat tree. `still_wanted`: one answer per sentence."""
        translator, starts = self.translator, self.starts
        limit = translator.model.max_positions - 1
        pieces = has_pieces(translator.vocab, words)
        kept = [[w for w, has in zip(ws, p) if has] for ws, p in zip(words, pieces)]
        encoded = translator.vocab.encode([" ".join(w) for w in kept])
        sources = [np.asarray(ids[:limit], dtype=np.int64) for ids in encoded]
        src_lens = torch.tensor([len(s) for s in sources])
        need = [len(w) + 2 + (len(s) if starts is not None else 0) for w, s in zip(kept, sources)]
        long_enough = (max_lengths(src_lens, cfg, translator.model.max_positions) >= torch.tensor(need)).tolist()
        notes = ParseNotes(no_pieces=[i for i, p in enumerate(pieces) if not all(p)])
        trees: list[Tree | None] = [None if not w else flat_tree(w) for w in words]
        todo = []
        for i, w in enumerate(kept):
            if not w:
                continue
            # with copying trees the pieces must make one word per word (not so when cut to the model's positions)
            one_each = starts is None or int(starts[torch.from_numpy(sources[i])].sum()) == len(w)
            if not one_each and len(encoded[i]) <= limit:
                notes.split.append(i)
            elif not one_each or not long_enough[i]:
                notes.too_long.append(i)
            else:
                todo.append(i)
        constraints = self.constraints([len(kept[i]) for i in todo])
        wanted = None if still_wanted is None else subset(still_wanted, np.array(todo, dtype=np.int64))
        request = SearchRequest([sources[i] for i in todo], cfg, max_tokens, batch_size, constraints=constraints)
        results = translate(translator, request, generator=generator, still_wanted=wanted)
        for i, hyps in zip(todo, results):
            try:  # (copied pieces are no tree tokens)
                tree = delinearize([self.tokens_of[t] for t in hyps[0].tokens if self.tokens_of[t]], kept[i])
                trees[i] = with_top(tag_punctuation(with_words_without_pieces(tree, words[i], pieces[i])))
            except ValueError:  # the constraint rules this out; keep the output usable if it ever fails
                notes.invalid.append(i)
        return trees, notes
