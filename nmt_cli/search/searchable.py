"""What the search (beam.py, greedy.py, translate.py) asks of a model: a Transformer (model/transformer.py) or an
Ensemble of them (ensemble.py). The encoder output and the cache are the model's own types, handed back to it
unchanged; the search reads only the encoder memory's batch size and device, and reorders the cache."""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class SearchEncoderOut(Protocol):
    """A model's encoder output as the search sees it."""

    @property
    def memory(self) -> Tensor: ...  # [B, S, D]: the batch size and device the search reads

    def select(self, rows: Tensor) -> Any: ...  # the sentences `rows` [B'], repeats allowed


class SearchModel(Protocol):
    """A model as the search steps it: `init_cache` once per batch, then `decode_step` once per step, its cache
    followed with `select_rows` and `select_sentences` (model/cache.py's DecoderCache)."""

    max_positions: int

    def init_cache(self, enc: Any, beam: int) -> Any: ...

    def decode_step(self, prev_tokens: Tensor, cache: Any) -> tuple[Tensor, Any]: ...
