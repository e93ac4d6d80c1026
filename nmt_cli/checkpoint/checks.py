"""Every field a checkpoint is read for, checked for its type and shape before anything uses it: a corrupted
checkpoint is one CheckpointError naming the file and the field (`FILE: field 'rng[0].torch' is ...`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nmt_cli.config import ModelConfig, SearchConfig, TrainConfig
from nmt_cli.errors import CheckpointError


def _is_int(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _ints(values: Any) -> bool:
    return all(_is_int(v) for v in values)


def _numbers(value: Any) -> bool:
    """A state_dict of tensors and numbers."""
    return isinstance(value, dict) and all(isinstance(v, torch.Tensor) or _is_number(v) for v in value.values())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# TrainState's counters (`train_state`), each with its test and description; a test checks it names every field.
COUNT: tuple[Callable[[Any], bool], str] = (_is_int, "a whole number >= 0")
SECONDS: tuple[Callable[[Any], bool], str] = (lambda v: _is_number(v) and v >= 0, "a number >= 0")
TEXT: tuple[Callable[[Any], bool], str] = (lambda v: isinstance(v, str), "a string")
FLAG: tuple[Callable[[Any], bool], str] = (lambda v: isinstance(v, bool), "True or False")
TRAIN_STATE_FIELDS = {
    "update": COUNT,
    "epoch": (lambda v: _is_int(v, least=1), "a whole number >= 1"),
    "batch_in_epoch": COUNT,
    "elapsed": SECONDS,
    "last_timed_save": SECONDS,
    "best": (lambda v: v is None or _is_number(v), "a number or None"),
    "bad_validations": COUNT,
    "n_skipped_updates": COUNT,
    "n_nonfinite_in_a_row": COUNT,
    "n_overflows": COUNT,
    "lr_start": COUNT,
    "train_data": TEXT,
    "best_metric": TEXT,
    "validation_due": FLAG,
    "numbered_due": FLAG,
}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a saved config value has its field's type (a tuple is saved as a tuple or a list)."""
    if isinstance(hint, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        return isinstance(value, (tuple, list)) and len(value) == len(args) and all(map(_fits, value, args))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _is_int(value, least=-(2**63))
    if hint is float:
        return _is_number(value)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of {str(value.dtype).removeprefix('torch.')}, shape {tuple(value.shape)}"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    text = repr(value)
    return f"a {type(value).__name__}" + (f" ({text})" if len(text) <= 40 else "")


class FieldCheck:
    """The fields of one checkpoint, checked one by one: the first that is wrong is one CheckpointError."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def expect(self, ok: bool, field: str, value: Any, expected: str) -> None:
        if not ok:
            raise CheckpointError(f"{self.path}: field '{field}' is {_described(value)} (expected {expected})")

    def config(self, ckpt: dict[str, Any], key: str, cls: type) -> None:
        saved = ckpt[key]
        self.expect(isinstance(saved, dict) and all(isinstance(k, str) for k in saved), key, saved, "a dict of options")
        hints = typing.get_type_hints(cls)
        for name, value in saved.items():  # unknown names are a newer nmt's, which config_from_dict says
            if name in hints:
                self.expect(_fits(value, hints[name]), f"{key}.{name}", value, _type_name(hints[name]))

    def tensor(self, value: Any, field: str, dtype: torch.dtype, numel: int | None = None) -> None:
        ok = isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == 1
        size = f", {numel} elements" if numel is not None else ""
        dtype_name = str(dtype).removeprefix("torch.")
        self.expect(ok and numel in (None, value.numel()), field, value, f"a 1-D tensor of {dtype_name}{size}")

    def rng(self, streams: Any) -> None:
        """Every rank's random streams, as runtime.set_rng_state puts them back."""
        self.expect(isinstance(streams, list) and len(streams) > 0, "rng", streams, "a list of random states by rank")
        for rank, rng in enumerate(streams):
            field = f"rng[{rank}]"
            ok = isinstance(rng, dict) and {"python", "numpy", "torch"} <= set(rng)
            self.expect(ok, field, rng, "a dict with python, numpy and torch states")
            python, numpy = rng["python"], rng["numpy"]
            ok = isinstance(python, tuple) and len(python) == 3 and isinstance(python[1], tuple) and _ints(python[1])
            self.expect(ok, f"{field}.python", python, "random.getstate()'s (version, tuple of ints, gauss)")
            ok = isinstance(numpy, list) and len(numpy) == 5 and numpy[0] == "MT19937" and isinstance(numpy[1], list)
            ok = ok and _ints([*numpy[1], numpy[2], numpy[3]]) and _is_number(numpy[4])
            self.expect(ok, f"{field}.numpy", numpy, "NumPy's legacy MT19937 state, a list of 5")
            self.tensor(rng["torch"], f"{field}.torch", torch.uint8, torch.get_rng_state().numel())
            if "dropout" in rng:
                dropout = rng["dropout"]
                state: Any = dropout if isinstance(dropout, dict) else {}
                inner = state.get("state") if isinstance(state.get("state"), dict) else {}
                ok = state.get("bit_generator") == "PCG64" and inner != {}
                ok = ok and _ints(
                    [inner.get("state"), inner.get("inc"), state.get("has_uint32"), state.get("uinteger")]
                )
                self.expect(ok, f"{field}.dropout", dropout, "a PCG64 state")
            if "cuda" in rng:
                self.expect(isinstance(rng["cuda"], list), f"{field}.cuda", rng["cuda"], "a list of CUDA states")
                for i, cuda in enumerate(rng["cuda"]):
                    self.tensor(cuda, f"{field}.cuda[{i}]", torch.uint8)

    def optimizer(self, saved: Any) -> None:
        """Adam's state_dict: its moments by parameter id, and the parameter groups naming those ids."""
        ok = isinstance(saved, dict) and {"state", "param_groups"} <= set(saved)
        self.expect(ok, "optimizer", saved, "an optimizer state_dict (state and param_groups)")
        groups = saved["param_groups"]
        ok = isinstance(groups, list) and all(isinstance(g, dict) for g in groups)
        self.expect(ok, "optimizer.param_groups", groups, "a list of dicts")
        ids: set[int] = set()
        for i, group in enumerate(groups):
            params = group.get("params")
            ok = isinstance(params, list) and _ints(params)
            self.expect(ok, f"optimizer.param_groups[{i}].params", params, "a list of parameter ids")
            ids.update(params)
        moments = saved["state"]
        self.expect(isinstance(moments, dict), "optimizer.state", moments, "a dict by parameter id")
        for key, value in moments.items():
            self.expect(key in ids, f"optimizer.state[{key!r}]", key, "the id of a parameter in param_groups")
            self.expect(_numbers(value), f"optimizer.state[{key!r}]", value, "a dict of tensors")

    def training(self, ckpt: dict[str, Any]) -> None:
        """The training keys, which resume reads (train/state.py)."""
        self.optimizer(ckpt["optimizer"])
        scaler = ckpt["grad_scaler"]
        self.expect(_numbers(scaler), "grad_scaler", scaler, "a loss scaler's state_dict (numbers), empty without fp16")
        self.expect(isinstance(ckpt["scheduler"], dict), "scheduler", ckpt["scheduler"], "a dict")
        self.expect(_is_int(ckpt["world_size"], least=1), "world_size", ckpt["world_size"], "a whole number >= 1")
        counters = ckpt["train_state"]
        self.expect(isinstance(counters, dict), "train_state", counters, "a dict of counters")
        for name, (fits, expected) in TRAIN_STATE_FIELDS.items():
            if name in counters:  # older checkpoints lack the newer counters, which keep their defaults
                self.expect(fits(counters[name]), f"train_state.{name}", counters[name], expected)
        self.rng(ckpt["rng"])


def check_fields(ckpt: dict[str, Any], path: Path) -> None:
    """Every field of the model keys, which translating, averaging and resuming read, checked."""
    check = FieldCheck(path)
    check.config(ckpt, "model_config", ModelConfig)
    for key, cls in (("train_config", TrainConfig), ("search_config", SearchConfig)):
        if key in ckpt:
            check.config(ckpt, key, cls)
    spm = ckpt["spm_model"]
    check.expect(isinstance(spm, bytes), "spm_model", spm, "the sentencepiece model's bytes")
    for key in ("nmt_version", "source_lang", "target_lang", "target_format", "tree_leaves"):
        value = ckpt.get(key)
        check.expect(value is None or isinstance(value, str), key, value, "a string")
    for key, least in (("update", 0), ("epoch", 0)):
        if key in ckpt:
            check.expect(_is_int(ckpt[key], least), key, ckpt[key], f"a whole number >= {least}")
    weights = ckpt["model"]
    check.expect(isinstance(weights, dict), "model", weights, "a dict of tensors by parameter name")
    for name, tensor in weights.items():
        check.expect(isinstance(name, str) and isinstance(tensor, torch.Tensor), f"model[{name!r}]", tensor, "a tensor")
    ema = ckpt.get("ema", weights)  # --ema-decay's average of the weights, by the same names
    check.expect(isinstance(ema, dict) and set(ema) == set(weights), "ema", ema, "a dict by the names of 'model'")
    for name, tensor in ema.items():
        check.expect(isinstance(tensor, torch.Tensor), f"ema[{name!r}]", tensor, "a tensor")
    averaged, updates = ckpt.get("averaged_from", []), ckpt.get("averaged_updates", [])
    ok = isinstance(averaged, list) and all(isinstance(p, str) for p in averaged)
    check.expect(ok, "averaged_from", averaged, "a list of paths")
    ok = isinstance(updates, list) and all(u is None or _is_int(u, 0) for u in updates)
    check.expect(ok, "averaged_updates", updates, "a list of whole numbers >= 0")


def check_training_fields(ckpt: dict[str, Any], path: Path) -> None:
    """The training keys, checked where a run resumes (one whose training state is damaged still translates)."""
    FieldCheck(path).training(ckpt)
