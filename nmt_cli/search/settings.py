"""The search settings of one request, shared by `nmt generate` and `nmt serve`: the checkpoint's saved
settings with the options given (refusing those the search would ignore), and the precision to search in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from nmt_cli.config import SearchConfig, flag_name
from nmt_cli.errors import ConfigError
from nmt_cli.runtime import resolve_precision

SAMPLING_FIELDS = ("sampling_topk", "sampling_topp", "temperature", "seed")  # options that only sampling reads


def search_settings(path: str, saved: SearchConfig, overrides: dict[str, Any], is_parser: bool) -> SearchConfig:
    """The checkpoint's search settings (`saved`) with the options given; refuse options the search would
    ignore. `path` names the checkpoint in errors."""
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
    if is_parser and search.min_len != saved.min_len:
        raise ConfigError(
            f"{path} is a parsing model: a tree's length follows its sentence's words, so --min-len "
            f"{search.min_len} cannot apply; drop it"
        )
    if is_parser and search.nbest > 1:
        raise ConfigError(
            f"{path} is a parsing model; it writes its best tree per sentence, not --nbest {search.nbest}"
        )
    return search


def generation_precision(precision: str | None, device: torch.device, trained: str | None) -> str:
    """--precision, else the checkpoint's training precision (`trained`) on CUDA; fp32 on CPU (its fastest float
    path)."""
    if precision is None:
        precision = trained if device.type == "cuda" else "fp32"
    return resolve_precision(device, precision)
