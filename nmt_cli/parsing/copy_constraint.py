"""The tree constraint for targets that spell their words (`--tree-leaves words`): each leaf is the word's
own sentencepiece pieces, copied from the input, then its POS tag, as in `(S (NP ▁The DT ▁c at NN ) ...`: a
decoder that has just written `▁c at` tags the word in its own input, and finds the next word by content, where
with tags alone it must count the leaves it wrote.

The search may start the next word wherever the plain constraint (constraint.py) allows a leaf; a started
word's next piece is then the only choice, and after its last piece only a tag is.

`--tree-leaves words-ahead` writes each word right after the previous tag (the first at the start):
`▁The (S (NP DT ▁c at NN ▁sits ) (VP VBZ ▁. ) . )`, so that the brackets between two words are chosen having read
the second, as a shift-reduce parser looks one word ahead (recipes/ptb_parsing/README.md).

Shapes: B sentences, N rows (sentences x beams), S pieces per sentence, V vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.data.vocab import EOS, UNK
from nmt_cli.parsing.constraint import LEAF, MAX_OPEN_RUN, NEG_INF, OTHER, TreeConstraint, TreeState


@dataclass
class CopyState:
    tree: TreeState  # depth, words still to tag, root opened, last token opening
    pos: Tensor  # [N] pieces copied so far
    copying: Tensor  # [N] bool, the last token was a piece: the word is still open
    pieces: Tensor  # [N, S + 1] the sentence's pieces in order, PAD after them
    starts: Tensor  # [N, S + 1] bool, the piece begins a word
    n_pieces: Tensor  # [N]
    untagged: Tensor  # [N] words begun (their first piece copied) but not yet tagged

    @property
    def at(self) -> Tensor:
        """[N, 1] the index of the next piece to copy (a dead beam's tokens may run past the end)."""
        return self.pos.clamp(max=self.pieces.shape[1] - 1)[:, None]

    def select(self, rows: Tensor) -> CopyState:
        """Reorder or subset rows [N'] (beams reordered, finished sentences removed)."""
        return CopyState(
            self.tree.select(rows),
            self.pos[rows],
            self.copying[rows],
            self.pieces[rows],
            self.starts[rows],
            self.n_pieces[rows],
            self.untagged[rows],
        )


class CopyingTreeConstraint:
    """`TreeConstraint` for one batch of sentences whose words the output copies; same interface."""

    rank_candidates = None  # beam search takes the best candidates by score

    def __init__(
        self, base: TreeConstraint, pieces: Tensor, n_pieces: Tensor, word_start: Tensor, ahead: bool = False
    ) -> None:
        """pieces: [B, S] each sentence's pieces (without EOS), n_pieces: [B] how many; word_start: [V] bool,
        the piece begins a word (sentencepiece's ▁); ahead: `--tree-leaves words-ahead`, each word is copied
        right after the previous tag (first: at the start), before the brackets that come between."""
        self.base = base
        self.ahead = ahead
        self.pieces = torch.cat([pieces, pieces.new_zeros(pieces.shape[0], 1)], dim=1)  # a column past the end
        self.n_pieces = n_pieces
        self.word_start = word_start.to(pieces.device)
        self.starts = self.word_start[self.pieces]
        self.starts[torch.arange(self.pieces.shape[1], device=pieces.device) >= n_pieces[:, None]] = False

    def start(self, n_leaves: Tensor) -> CopyState:
        """The state before the first token: n_leaves [N] words of each row, rows sentence-major (N = B*K)."""
        beams = n_leaves.shape[0] // self.pieces.shape[0]
        zeros = torch.zeros_like(n_leaves)
        return CopyState(
            self.base.start(n_leaves),
            zeros,
            zeros.bool(),
            self.pieces.repeat_interleave(beams, dim=0),
            self.starts.repeat_interleave(beams, dim=0),
            self.n_pieces.repeat_interleave(beams, dim=0),
            zeros.clone(),
        )

    def allowed(self, state: CopyState, step: int, max_len: Tensor) -> Tensor:
        """[N, V] True where a token keeps the row completable: every piece still to copy, every tag and
        every open bracket's `)` needs one token more before EOS."""
        return self._allowed(state, step, max_len)[0]

    def _allowed(self, state: CopyState, step: int, max_len: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(allowed [N, V], the next piece to copy [N], rows that continue a word [N], rows that may begin one [N])."""
        tree, free = state.tree, ~state.copying
        d, left = tree.depth, tree.leaves_left
        room = max_len - (step + 1)
        to_copy = state.n_pieces - state.pos
        at = state.at
        next_piece = state.pieces.gather(1, at)[:, 0]
        next_starts = state.starts.gather(1, at)[:, 0]
        continues = state.copying & (to_copy > 0) & ~next_starts
        short_run = tree.open_run < MAX_OPEN_RUN
        if self.ahead:  # the next word is copied as soon as the previous one is tagged (at once at the start)
            continues = continues | ((state.untagged == 0) & (to_copy > 0))
            free = ~continues
            begins = torch.zeros_like(free)
        else:
            begins = free & (d >= 1) & (left >= 1) & (to_copy > 0) & (to_copy - 1 + left + d <= room)
        by_class = torch.stack(
            [
                torch.zeros_like(free),
                free & (left >= 1) & ((d >= 1) | ~tree.started) & (to_copy + left + d + 1 <= room) & short_run,
                free & (d >= 1) & ~tree.last_open & ((d >= 2) | (left == 0)),
                (free & (d >= 1) & (left >= 1) & (to_copy + left - 1 + d <= room))
                if self.ahead
                else state.copying & ~continues,
                free & tree.started & (d == 0),
            ],
            dim=1,
        )  # [N, 5]: OTHER, OPEN, CLOSE_CLASS, LEAF, END (constraint.py)
        allowed = by_class[:, self.base.token_class.to(d.device)]  # [N, V]
        allowed = allowed.scatter_(1, next_piece[:, None], (continues | begins)[:, None])
        return allowed, next_piece, continues, begins

    def mask(self, log_probs: Tensor, state: CopyState, step: int, max_len: Tensor) -> Tensor:
        """log_probs [N, V] with every token that would break the tree or the copy set to -inf, and the copied
        pieces scored as the choices they are: beginning a word has the probability of beginning any word (the
        sum over the pieces that begin one), continuing it probability 1. Scored as themselves, words the model
        did not expect lost to any opening bracket, and undertrained models wrote (NP (NP (NP ... before each."""
        allowed, next_piece, continues, begins = self._allowed(state, step, max_len)
        any_start = log_probs.masked_fill(~self.word_start[: log_probs.shape[1]], NEG_INF).logsumexp(-1)  # [N]
        current = log_probs.gather(1, next_piece[:, None])[:, 0]
        copied = torch.where(continues, torch.zeros_like(current), torch.where(begins, any_start, current))
        out = log_probs.masked_fill(~allowed, NEG_INF)
        return out.scatter_(
            1, next_piece[:, None], torch.where(allowed.gather(1, next_piece[:, None])[:, 0], copied, NEG_INF)[:, None]
        )

    def advance(self, state: CopyState, tokens: Tensor) -> CopyState:
        """The state after each row emitted tokens [N] (EOS and padding leave it unchanged)."""
        cls = self.base.token_class.to(tokens.device)[tokens]
        is_piece = (cls == OTHER) & ((tokens > EOS) | (tokens == UNK))  # a character no piece spells is <unk>
        begun = is_piece & state.starts.gather(1, state.at)[:, 0]
        return CopyState(
            self.base.advance(state.tree, tokens),
            state.pos + is_piece.long(),
            is_piece,
            state.pieces,
            state.starts,
            state.n_pieces,
            state.untagged + begun.long() - (cls == LEAF).long(),
        )
