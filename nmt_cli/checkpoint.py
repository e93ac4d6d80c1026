"""Checkpoints, the format defined once: make, atomic save, checked load, upgrade of older formats.

A checkpoint is a dict of primitives and tensors that loads with `torch.load(weights_only=True)`;
it carries the model and training configs, the search settings and the sentencepiece model, so
`generate` and `average-checkpoints` (commands/average.py) need nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from nmt_cli import __version__
from nmt_cli.config import ModelConfig, SearchConfig, TrainConfig, config_to_dict, parses_trees
from nmt_cli.data.dataset import SPM_FILE
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import CheckpointError
from nmt_cli.files import atomic_write
from nmt_cli.model.transformer import Transformer, build_model

logger = logging.getLogger(__name__)

FORMAT_VERSION = 4
LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"
# The checkpoint format, defined once. Every checkpoint has the model keys (all that translating and averaging
# need); a checkpoint that training can resume from has the training keys too.
MODEL_KEYS = (
    "format_version",
    "nmt_version",
    "model_config",
    "train_config",
    "search_config",
    "spm_model",
    "source_lang",
    "target_lang",
    "target_format",
    "tree_leaves",
    "update",
    "epoch",
    "model",
)
# Train options about how a run computes, not what it trains: not saved, so a resumed run may change them.
RUNTIME_OPTIONS = ("compile", "cudnn_attention")
TRAINING_KEYS = ("optimizer", "scheduler", "grad_scaler", "train_state", "world_size", "rng")


def make_checkpoint(
    *,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    search_cfg: SearchConfig,
    vocab: Vocab,
    langs: tuple[str, str],
    weights: dict[str, torch.Tensor],
    update: int,
    epoch: int,
    training: dict[str, Any] | None = None,
    target_format: str = "text",
    tree_leaves: str | None = None,
) -> dict[str, Any]:
    """A checkpoint dict with every model key, plus the training keys when `training` is given.

    target_format: "text" (translation) or "ptb-tree" (a constituency parser, nmt_cli/parsing), with its
    tree_leaves ("pos" or "slot")."""
    state = {
        "format_version": FORMAT_VERSION,
        "nmt_version": __version__,
        "model_config": config_to_dict(model_cfg),
        "train_config": {k: v for k, v in config_to_dict(train_cfg).items() if k not in RUNTIME_OPTIONS},
        "search_config": config_to_dict(search_cfg),
        "spm_model": vocab.model_bytes,
        "source_lang": langs[0],
        "target_lang": langs[1],
        "target_format": target_format,
        "tree_leaves": tree_leaves,
        "update": update,
        "epoch": epoch,
        "model": weights,
    }
    if training is not None:
        assert set(training) == set(TRAINING_KEYS), sorted(set(training) ^ set(TRAINING_KEYS))
        state.update(training)
    return state


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """Bring an older checkpoint to FORMAT_VERSION, one version step at a time."""
    if state["format_version"] == 1:
        state = upgrade_v1_to_v2(state)
    if state["format_version"] == 2:
        state = upgrade_v2_to_v3(state)
    if state["format_version"] == 3:
        state = upgrade_v3_to_v4(state)
    return state


def upgrade_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """v2: --arch lives in the model config only; --bf16/--fp16 became one --precision field."""
    train = dict(state.get("train_config", {}))
    train.pop("arch", None)
    bf16, fp16 = train.pop("bf16", False), train.pop("fp16", False)
    train["precision"] = "fp16" if fp16 else "bf16" if bf16 else "fp32"
    return {**state, "train_config": train, "format_version": 2}


def upgrade_v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    """v3: `rng` holds every rank's random streams, a list by rank; v2 held one process's."""
    if isinstance(state.get("rng"), dict):
        state = {**state, "rng": [state["rng"]]}
    return {**state, "format_version": 3}


def upgrade_v3_to_v4(state: dict[str, Any]) -> dict[str, Any]:
    """v4: the task is recorded (target_format "text" or "ptb-tree"); every earlier checkpoint translates."""
    return {**state, "target_format": "text", "tree_leaves": None, "format_version": 4}


def has_training_state(state: dict[str, Any]) -> bool:
    return all(k in state for k in TRAINING_KEYS)


def _is_int(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The counters of train/state.py's TrainState as a checkpoint saves them (`train_state`), each with the test of
# its type that resume needs and its description. tests/faults/test_checkpoint_fields.py checks that this table
# names every field of TrainState.
COUNT: tuple[Callable[[Any], bool], str] = (_is_int, "a whole number >= 0")
SECONDS: tuple[Callable[[Any], bool], str] = (lambda v: _is_number(v) and v >= 0, "a number >= 0")
TEXT: tuple[Callable[[Any], bool], str] = (lambda v: isinstance(v, str), "a string")
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
    """The fields of one checkpoint, checked one by one: the first that is wrong is one CheckpointError naming the
    file and the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def expect(self, ok: bool, field: str, value: Any, expected: str) -> None:
        if not ok:
            raise CheckpointError(f"{self.path}: field '{field}' is {_described(value)} (expected {expected})")

    def config(self, state: dict[str, Any], key: str, cls: type) -> None:
        saved = state[key]
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
        torch_size = torch.get_rng_state().numel()
        for rank, rng in enumerate(streams):
            field = f"rng[{rank}]"
            self.expect(
                isinstance(rng, dict) and {"python", "numpy", "torch"} <= set(rng),
                field,
                rng,
                "a dict with python, numpy and torch states",
            )
            python = rng["python"]
            self.expect(
                isinstance(python, tuple)
                and len(python) == 3
                and isinstance(python[1], tuple)
                and all(_is_int(x) for x in python[1]),
                f"{field}.python",
                python,
                "random.getstate()'s (version, tuple of ints, gauss)",
            )
            numpy = rng["numpy"]
            self.expect(
                isinstance(numpy, list)
                and len(numpy) == 5
                and numpy[0] == "MT19937"
                and isinstance(numpy[1], list)
                and all(_is_int(x) for x in numpy[1])
                and _is_int(numpy[2])
                and _is_int(numpy[3])
                and _is_number(numpy[4]),
                f"{field}.numpy",
                numpy,
                "NumPy's legacy MT19937 state, a list of 5",
            )
            self.tensor(rng["torch"], f"{field}.torch", torch.uint8, torch_size)
            if "dropout" in rng:
                dropout = rng["dropout"]
                inner = dropout.get("state") if isinstance(dropout, dict) else None
                self.expect(
                    isinstance(dropout, dict)
                    and dropout.get("bit_generator") == "PCG64"
                    and isinstance(inner, dict)
                    and _is_int(inner.get("state"))
                    and _is_int(inner.get("inc"))
                    and _is_int(dropout.get("has_uint32"))
                    and _is_int(dropout.get("uinteger")),
                    f"{field}.dropout",
                    dropout,
                    "a PCG64 state",
                )
            if "cuda" in rng:
                self.expect(isinstance(rng["cuda"], list), f"{field}.cuda", rng["cuda"], "a list of CUDA states")
                for i, cuda in enumerate(rng["cuda"]):
                    self.tensor(cuda, f"{field}.cuda[{i}]", torch.uint8)

    def optimizer(self, saved: Any) -> None:
        """Adam's state_dict: its moments by parameter id, and the parameter groups naming those ids."""
        self.expect(
            isinstance(saved, dict) and {"state", "param_groups"} <= set(saved),
            "optimizer",
            saved,
            "an optimizer state_dict (state and param_groups)",
        )
        groups = saved["param_groups"]
        self.expect(
            isinstance(groups, list) and all(isinstance(g, dict) for g in groups),
            "optimizer.param_groups",
            groups,
            "a list of dicts",
        )
        ids: set[int] = set()
        for i, group in enumerate(groups):
            params = group.get("params")
            self.expect(
                isinstance(params, list) and all(_is_int(p) for p in params),
                f"optimizer.param_groups[{i}].params",
                params,
                "a list of parameter ids",
            )
            ids.update(params)
        moments = saved["state"]
        self.expect(isinstance(moments, dict), "optimizer.state", moments, "a dict by parameter id")
        for key, value in moments.items():
            self.expect(key in ids, f"optimizer.state[{key!r}]", key, "the id of a parameter in param_groups")
            self.expect(
                isinstance(value, dict) and all(isinstance(v, torch.Tensor) or _is_number(v) for v in value.values()),
                f"optimizer.state[{key!r}]",
                value,
                "a dict of tensors",
            )

    def training(self, state: dict[str, Any]) -> None:
        """The training keys, which resume reads (train/state.py)."""
        self.optimizer(state["optimizer"])
        scaler = state["grad_scaler"]
        self.expect(
            isinstance(scaler, dict) and all(isinstance(v, torch.Tensor) or _is_number(v) for v in scaler.values()),
            "grad_scaler",
            scaler,
            "a loss scaler's state_dict (a dict of numbers), empty without fp16",
        )
        self.expect(isinstance(state["scheduler"], dict), "scheduler", state["scheduler"], "a dict")
        self.expect(_is_int(state["world_size"], least=1), "world_size", state["world_size"], "a whole number >= 1")
        counters = state["train_state"]
        self.expect(isinstance(counters, dict), "train_state", counters, "a dict of counters")
        for name, (fits, expected) in TRAIN_STATE_FIELDS.items():
            if name in counters:  # older checkpoints lack the newer counters, which keep their defaults
                self.expect(fits(counters[name]), f"train_state.{name}", counters[name], expected)
        self.rng(state["rng"])


def check_fields(state: dict[str, Any], path: Path) -> None:
    """Every field of the model keys, which translating, averaging and resuming read, checked for its type and
    shape, so that a corrupted checkpoint is one CheckpointError naming the file and the field instead of a
    TypeError deep inside torch or the search. Resume checks the training keys too (`check_training_fields`)."""
    check = FieldCheck(path)
    check.config(state, "model_config", ModelConfig)
    for key, cls in (("train_config", TrainConfig), ("search_config", SearchConfig)):
        if key in state:
            check.config(state, key, cls)
    check.expect(
        isinstance(state["spm_model"], bytes), "spm_model", state["spm_model"], "the sentencepiece model's bytes"
    )
    for key in ("nmt_version", "source_lang", "target_lang", "target_format", "tree_leaves"):
        value = state.get(key)
        check.expect(value is None or isinstance(value, str), key, value, "a string")
    for key, least in (("update", 0), ("epoch", 0)):
        if key in state:
            check.expect(_is_int(state[key], least), key, state[key], f"a whole number >= {least}")
    weights = state["model"]
    check.expect(isinstance(weights, dict), "model", weights, "a dict of tensors by parameter name")
    for name, tensor in weights.items():
        check.expect(isinstance(name, str) and isinstance(tensor, torch.Tensor), f"model[{name!r}]", tensor, "a tensor")
    averaged = state.get("averaged_from", [])
    check.expect(
        isinstance(averaged, list) and all(isinstance(p, str) for p in averaged),
        "averaged_from",
        averaged,
        "a list of paths",
    )


def check_training_fields(state: dict[str, Any], path: Path) -> None:
    """The training keys, checked as `check_fields` checks the others, where a run resumes from them (a checkpoint
    whose training state is damaged still translates)."""
    FieldCheck(path).training(state)


def save_checkpoint(state: dict[str, Any], path: Path, kept: str | None = None) -> None:
    """Write through `path.tmp`, fsync, then rename: a killed job or a full disk never leaves a half-written file.

    Raises:
        DiskFullError: no space left; the temporary is removed and the previous file is intact (`kept` says
            what the user still has).
    """
    atomic_write(path, lambda f: torch.save(state, f), "checkpoint", kept)


def spm_fingerprint(model_bytes: bytes) -> str:
    """The sentencepiece model's identity: sha256 of its bytes (data dirs and checkpoints are bound by it)."""
    return hashlib.sha256(model_bytes).hexdigest()


def check_same_data(
    state: dict[str, Any],
    ckpt_path: Path,
    data_dir: Path,
    meta: dict[str, Any],
    spm_bytes: bytes,
    remedy: str = "use a data directory of the checkpoint's languages and direction",
) -> None:
    """Refuse a data directory made with another sentencepiece model, or for other languages or the
    other direction, than the checkpoint was trained on (`remedy` ends that error)."""
    trained = (state.get("source_lang"), state.get("target_lang"))
    check_data_fits(
        bytes(state["spm_model"]), trained, ckpt_path, data_dir=data_dir, meta=meta, spm_bytes=spm_bytes, remedy=remedy
    )


def check_data_fits(
    spm_model: bytes,
    trained: tuple[str | None, str | None],
    ckpt_path: Path,
    *,
    data_dir: Path,
    meta: dict[str, Any],
    spm_bytes: bytes,
    remedy: str = "use a data directory of the checkpoint's languages and direction",
) -> None:
    """check_same_data, given the checkpoint's sentencepiece model and its languages (`trained`)."""
    ours, theirs = spm_fingerprint(spm_model), spm_fingerprint(spm_bytes)
    if ours != theirs:
        raise CheckpointError(
            f"{data_dir / SPM_FILE} (sha256 {theirs[:12]}) is not the sentencepiece model of {ckpt_path} "
            f"(sha256 {ours[:12]}); the data directory was made with another vocabulary"
        )
    given = (meta["source_lang"], meta["target_lang"])
    if None not in trained and trained != given:
        raise CheckpointError(
            f"{ckpt_path} was trained {trained[0]}->{trained[1]} but {data_dir} holds {given[0]}->{given[1]}; {remedy}"
        )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load and check a checkpoint on the CPU; CheckpointError if it is missing or not one of ours."""
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; give a checkpoint file")
    if not path.is_file():
        parts = [Path(p) for p in str(path).split(":")]
        if len(parts) > 1 and all(p.is_file() for p in parts):  # fairseq's --path A.pt:B.pt, an ensemble
            raise CheckpointError(
                f"checkpoint {path} names {len(parts)} checkpoints; nmt translates with one (no ensembles): average "
                f"them with `nmt average-checkpoints --inputs {' '.join(map(str, parts))} --output average.pt`"
            )
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        # Memory-mapped: tensors are read when touched, so the optimizer state of a checkpoint that is only
        # translated with is never read, and weights copied into a model are not kept twice in memory.
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises many types for a file that is not a checkpoint
        raise CheckpointError(f"{path} is not a readable nmt checkpoint ({type(e).__name__})") from None
    if not isinstance(state, dict) or any(
        k not in state for k in ("format_version", "model_config", "model", "spm_model")
    ):
        raise CheckpointError(f"{path} is not an nmt checkpoint (missing model, config or vocabulary)")
    if not isinstance(state["format_version"], int):
        raise CheckpointError(f"{path} has an invalid format version {state['format_version']!r}")
    if state["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {state['format_version']}; this nmt "
            f"{__version__} reads up to {FORMAT_VERSION}; upgrade nmt"
        )
    state = upgrade(state)
    check_fields(state, path)
    return state


def config_from_dict(cls: type, d: dict[str, Any], what: str) -> Any:
    """Rebuild a config saved in a checkpoint; unknown keys mean a newer nmt wrote it."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise CheckpointError(f"{what} has unknown fields {unknown}; it was written by a newer nmt")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return cls(**d)


def model_config_of(state: dict[str, Any], path: Path) -> ModelConfig:
    return config_from_dict(ModelConfig, state["model_config"], f"model config of {path}")


def search_config_of(state: dict[str, Any]) -> SearchConfig:
    return config_from_dict(SearchConfig, state.get("search_config", {}), "search config")


def vocab_of(state: dict[str, Any], path: Path) -> Vocab:
    return Vocab(state["spm_model"], f"sentencepiece model inside {path}")


def load_model_weights(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], path: Path, assign: bool = False
) -> None:
    """Load a state dict, turning shape or name mismatches into one-line CheckpointErrors.

    assign: the model takes the checkpoint's tensors themselves instead of copying them (for a model built
    on the meta device, see `model_around_weights`); floating tensors are cast to the model's dtype.
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{path} does not fit this model: {name} has shape {tuple(tensor.shape)}, "
                f"the model needs {tuple(expected[name].shape)}"
            )
    if assign:
        weights = {name: t.to(expected[name].dtype) if t.is_floating_point() else t for name, t in weights.items()}
    model.load_state_dict(weights, assign=assign)


def model_around_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], path: Path) -> Transformer:
    """The model of `cfg` holding the checkpoint's own tensors, for inference.

    Built on the meta device, so nothing is allocated or randomly initialised for weights that are
    replaced at once, and with a memory-mapped checkpoint the weights are read from the file as used.
    Tied weights come back as separate parameters that share their storage.
    """
    with torch.device("meta"):
        model = build_model(cfg)
    load_model_weights(model, weights, path, assign=True)
    return model


# Regularisation, not shape: a run may resume with other rates, and checkpoints that differ only in them average.
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")


def shape_differences(saved: ModelConfig, wanted: ModelConfig) -> list[str]:
    """The fields, dropouts aside, in which two model configs differ: `name=saved (options say wanted)`."""
    return [
        f"{f.name}={getattr(saved, f.name)!r} (options say {getattr(wanted, f.name)!r})"
        for f in fields(ModelConfig)
        if f.name not in DROPOUTS and getattr(saved, f.name) != getattr(wanted, f.name)
    ]


@dataclass(frozen=True)
class SavedModel:
    """A checkpoint as translating reads it (`read_saved_model`), once and typed: the model's config and weights,
    its vocabulary and saved search settings, the task, and what it was trained on. generate, serve, plot
    attention and export read a checkpoint through this, not through the raw dict."""

    path: Path
    config: ModelConfig
    search: SearchConfig
    vocab: Vocab
    is_parser: bool  # config.parses_trees of its target_format, asked here once
    tree_leaves: str | None  # a parser's --tree-leaves
    train_precision: str | None
    source_lang: str | None
    target_lang: str | None
    update: int | None
    weights: dict[str, torch.Tensor]

    def model(self) -> Transformer:
        """The model holding the checkpoint's own tensors (`model_around_weights`), in eval mode, on the CPU."""
        return model_around_weights(self.config, self.weights, self.path).eval()

    def without_weights(self) -> SavedModel:
        """The same, its weights let go (a model built from them holds its own copy)."""
        return replace(self, weights={})

    def check_same_data(self, data_dir: Path, meta: dict[str, Any], spm_bytes: bytes) -> None:
        """Refuse a data directory of another vocabulary or direction (`check_same_data`)."""
        trained = (self.source_lang, self.target_lang)
        check_data_fits(self.vocab.model_bytes, trained, self.path, data_dir=data_dir, meta=meta, spm_bytes=spm_bytes)


def read_saved_model(path: Path) -> SavedModel:
    """The checkpoint at `path`, loaded and checked (`load_checkpoint`), as translating reads it."""
    state = load_checkpoint(path)
    return SavedModel(
        path=path,
        config=model_config_of(state, path),
        search=search_config_of(state),
        vocab=vocab_of(state, path),
        is_parser=parses_trees(state.get("target_format")),
        tree_leaves=state.get("tree_leaves"),
        train_precision=state.get("train_config", {}).get("precision"),
        source_lang=state.get("source_lang"),
        target_lang=state.get("target_lang"),
        update=state.get("update"),
        weights=state["model"],
    )


def numbered_checkpoints(directory: Path) -> list[Path]:
    """checkpoint_<update>.pt files in update order."""
    found = []
    for path in directory.glob("checkpoint_*.pt"):
        match = re.fullmatch(r"checkpoint_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [p for _, p in sorted(found)]
