"""Ensembles of checkpoints (`--path A.pt:B.pt`, fairseq's syntax): several models searched as one. An `Ensemble` offers
the search what a Transformer offers it (searchable.py): every member's encoder output and decoder cache, and a
`decode_step` that scores each row by the weighted average of the members' log-probabilities (`weights`, summing to
1), as Marian does. The members share the vocabulary, languages and task (`check_members`) and may differ in shape.

Shapes: B sentences, N rows (sentences times beams), V vocabulary."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from torch import Tensor

from nmt_cli.checkpoint.saved import SavedModel, mismatch
from nmt_cli.errors import CheckpointError, ConfigError
from nmt_cli.model.cache import DecoderCache
from nmt_cli.model.slots import SlotCache
from nmt_cli.model.transformer import EncoderOut, Transformer
from nmt_cli.search.settings import SearchBounds


@dataclass
class EnsembleEncoderOut:
    """Each member's encoder output, in member order."""

    members: list[EncoderOut]

    @property
    def memory(self) -> Tensor:
        """The first member's memory [B, S, D]: the batch size and device the search reads."""
        return self.members[0].memory

    def select(self, rows: Tensor) -> EnsembleEncoderOut:
        """The sentences `rows` [B'] (repeats allowed) of every member's output."""
        return EnsembleEncoderOut([enc.select(rows) for enc in self.members])


@dataclass
class EnsembleCache:
    """Each member's decoder cache, in member order; the search reorders them all alike."""

    members: list[DecoderCache]

    def select_rows(self, rows: Tensor) -> EnsembleCache:
        """Follow the surviving beams in every member (DecoderCache.select_rows)."""
        return EnsembleCache([cache.select_rows(rows) for cache in self.members])

    def select_sentences(self, sentences: Tensor, rows: Tensor) -> EnsembleCache:
        """Keep only some sentences in every member (DecoderCache.select_sentences)."""
        return EnsembleCache([cache.select_sentences(sentences, rows) for cache in self.members])


@dataclass
class EnsembleSlotCache:
    """Each member's fixed-slot cache (model/slots.py), in member order."""

    members: list[SlotCache]

    @property
    def step(self) -> Tensor:
        """[N] each row's position: the members step alike."""
        return self.members[0].step

    def select(self, sentences: Tensor, rows: Tensor) -> EnsembleSlotCache:
        """Every member's cache of fewer slots (SlotCache.select)."""
        return EnsembleSlotCache([cache.select(sentences, rows) for cache in self.members])

    def load(self, other: EnsembleSlotCache, written: int) -> None:
        """Load `other`'s batch into every member's buffers (SlotCache.load)."""
        for mine, theirs in zip(self.members, other.members):
            mine.load(theirs, written)

    def steps(self) -> list[Tensor]:
        return [cache.steps() for cache in self.members]

    def restart(self, steps: list[Tensor]) -> None:
        for cache, saved in zip(self.members, steps):
            cache.restart(saved)

    def park(self, rows: Tensor) -> None:
        for cache in self.members:
            cache.park(rows)


class Ensemble:
    """Several Transformers of one vocabulary, searched as one model (see the module's docstring).

    members: the models, each built, moved and packed as a single model is (search/translate.py);
    weights: one per member, positive, summing to 1.
    """

    def __init__(self, members: Sequence[Transformer], weights: Sequence[float]) -> None:
        assert len(members) == len(weights) > 1, "an ensemble has a weight per member, and two members or more"
        self.members = list(members)
        self.weights = tuple(weights)
        self.max_positions = min(m.max_positions for m in self.members)  # every member's positions fit

    def encode(self, src_tokens: Tensor, src_pad_mask: Tensor | None) -> EnsembleEncoderOut:
        """src_tokens: [B, S] -> each member's memory."""
        return EnsembleEncoderOut([m.encode(src_tokens, src_pad_mask) for m in self.members])

    def encode_steps(
        self, src_tokens: Tensor, src_pad_mask: Tensor | None
    ) -> Generator[None, None, EnsembleEncoderOut]:
        """`encode` one member's layer per resumption (Transformer.encode_steps), returning every member's memory."""
        memories = []
        for member in self.members:
            memories.append((yield from member.encode_steps(src_tokens, src_pad_mask)))
        return EnsembleEncoderOut(memories)

    def init_cache(self, enc: EnsembleEncoderOut, beam: int) -> EnsembleCache:
        return EnsembleCache([m.init_cache(e, beam) for m, e in zip(self.members, enc.members)])

    def decode_step(self, prev_tokens: Tensor, cache: EnsembleCache) -> tuple[Tensor, EnsembleCache]:
        """Advance every member one token on its own cache. prev_tokens: [N] -> (the weighted average of the
        members' log-probs [N, V] in float32, the cache)."""
        steps = [m.decode_step(prev_tokens, c) for m, c in zip(self.members, cache.members)]
        return self.average([log_probs for log_probs, _ in steps]), EnsembleCache([c for _, c in steps])

    def average(self, log_probs: list[Tensor]) -> Tensor:
        """The members' log-probs [N, V] weighted, summed in the first one's tensor (each member's step returns
        its own); the weights are host numbers: no wait for the device."""
        total = log_probs[0].mul_(self.weights[0])
        for member_log_probs, weight in zip(log_probs[1:], self.weights[1:]):
            total.add_(member_log_probs, alpha=weight)
        return total

    def init_slots(self, enc: EnsembleEncoderOut, beam: int, *, n_positions: int, source_len: int) -> EnsembleSlotCache:
        """Every member's fixed-slot cache (Transformer.init_slots)."""
        return EnsembleSlotCache(
            [
                m.init_slots(e, beam, n_positions=n_positions, source_len=source_len)
                for m, e in zip(self.members, enc.members)
            ]
        )

    def decode_slots(
        self, prev_tokens: Tensor, rows: Tensor | None, cache: EnsembleSlotCache, window: int | None = None
    ) -> Tensor:
        """`decode_step` over every member's fixed slots (Transformer.decode_slots): the weighted average of the
        members' log-probs [N, V] in float32."""
        return self.average([m.decode_slots(prev_tokens, rows, c, window) for m, c in zip(self.members, cache.members)])


def member_paths(path: str) -> list[Path]:
    """The checkpoints `--path` names: itself when it is a file (or holds no colon), else its colon-separated
    parts (fairseq's A.pt:B.pt); ConfigError for an empty part."""
    if ":" not in path or Path(path).is_file():
        return [Path(path)]
    parts = path.split(":")
    if not all(parts):
        raise ConfigError(f"--path {path!r} has an empty checkpoint name; give A.pt:B.pt for an ensemble")
    return [Path(p) for p in parts]


def member_weights(weights: tuple[float, ...] | None, paths: Sequence[Path]) -> tuple[float, ...]:
    """The members' weights: `weights` (config.ensemble_weights' values), else equal; ConfigError naming
    --weights when their count is not that of the checkpoints."""
    if weights is None:
        return tuple(1.0 / len(paths) for _ in paths)
    if len(weights) != len(paths):
        raise ConfigError(
            f"--weights has {len(weights)} value(s) for {len(paths)} checkpoint(s) of --path "
            f"{':'.join(map(str, paths))}; give one weight per checkpoint"
        )
    return weights


def check_members(members: Sequence[SavedModel]) -> None:
    """Refuse an ensemble whose members do not translate alike (checkpoint.mismatch: another sentencepiece model,
    other languages or direction, or another task); the CheckpointError names both files. Members may differ in
    shape."""
    for other in members[1:]:
        if problem := mismatch(members[0], other):
            raise CheckpointError(
                f"{members[0].path} and {other.path} {problem}; an ensemble's checkpoints must share the vocabulary, "
                "the languages and the task"
            )


def ensemble_bounds(members: Sequence[SearchBounds]) -> SearchBounds:
    """The SearchBounds of an ensemble (search/settings.py's memory refusal): every member's cached keys and values
    together, counted as one layer's, within the smallest member's positions."""
    first = members[0]
    if len(members) == 1:
        return first
    width = sum(b.decoder_layers * b.state_width for b in members)
    return replace(first, decoder_layers=1, state_width=width, max_positions=min(b.max_positions for b in members))
