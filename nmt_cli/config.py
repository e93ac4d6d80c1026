"""Typed configs for every command, the architecture presets, and their validation.

Field names match the CLI flags one to one (`--d-model` <-> `d_model`). Configs are frozen
dataclasses of primitives so that they travel inside checkpoints as plain dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from nmt_cli.errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (paper Table 3 knobs). vocab_size comes from the data."""

    arch: str = "transformer_base"
    vocab_size: int = 0
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    normalize_before: bool = False
    learned_pos: bool = False
    share_embeddings: bool = True
    share_output_embed: bool = True
    max_positions: int = 1024

    def __post_init__(self) -> None:
        for name in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.d_model % self.heads:
            raise ConfigError(f"d_model={self.d_model} must be divisible by heads={self.heads}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}={getattr(self, name)} must be in [0, 1)")


ARCHITECTURES: dict[str, ModelConfig] = {
    "transformer_base": ModelConfig(arch="transformer_base"),
    "transformer_big": ModelConfig(arch="transformer_big", d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    "transformer_small": ModelConfig(arch="transformer_small", encoder_layers=3, decoder_layers=3,
                                     d_model=256, d_ff=1024, heads=4, dropout=0.1),
    "transformer_tiny": ModelConfig(arch="transformer_tiny", encoder_layers=2, decoder_layers=2,
                                    d_model=32, d_ff=64, heads=2, dropout=0.1, max_positions=256),
    # Constituency parsing, paper section 6.3: 4 + 4 layers, d_model 1024 (its search settings: PARSE_SEARCH).
    "transformer_parse": ModelConfig(arch="transformer_parse", encoder_layers=4, decoder_layers=4,
                                     d_model=1024, d_ff=4096, heads=16),
}


def model_config_from_arch(arch: str, vocab_size: int, overrides: dict[str, Any]) -> ModelConfig:
    """The preset for `arch` with every non-None override applied: a flag always beats the preset."""
    if arch not in ARCHITECTURES:
        raise ConfigError(f"unknown --arch {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(ARCHITECTURES[arch], vocab_size=vocab_size, **given)


@dataclass(frozen=True)
class PreprocessConfig:
    source_lang: str
    target_lang: str
    trainpref: str
    destdir: str
    validpref: str | None = None
    testpref: str | None = None  # comma-separated prefixes: test, test1, test2, ...
    vocab_size: int = 8000
    model_type: str = "bpe"
    character_coverage: float = 1.0
    spm_model: str | None = None
    spm_train_sentences: int = 10_000_000
    max_len: int = 250
    max_len_ratio: float = 1.5
    workers: int = 1
    target_format: str = "text"  # or "ptb-tree": one bracketed tree per target line (nmt_cli/parsing)
    tree_leaves: str = "pos"  # ptb-tree: leaves are POS tags ("pos") or the placeholder XX ("slot")

    def __post_init__(self) -> None:
        if self.target_format not in ("text", "ptb-tree"):
            raise ConfigError(f"--target-format {self.target_format!r} must be text or ptb-tree")
        if self.tree_leaves not in ("pos", "slot"):
            raise ConfigError(f"--tree-leaves {self.tree_leaves!r} must be pos or slot")
        if self.source_lang == self.target_lang:
            raise ConfigError(f"--source-lang and --target-lang are both {self.source_lang!r}; "
                              "they must differ")
        if self.model_type not in ("bpe", "unigram"):
            raise ConfigError(f"--model-type {self.model_type!r} must be bpe or unigram")
        if self.vocab_size < 8:
            raise ConfigError(f"--vocab-size {self.vocab_size} is too small (at least 8)")


@dataclass(frozen=True)
class SearchConfig:
    """How `generate` (and BLEU during training) searches. Saved in checkpoints."""

    beam: int = 4
    lenpen: float = 0.6
    lenpen_style: str = "gnmt"
    max_len_a: float = 1.0
    max_len_b: int = 50
    min_len: int = 1
    unkpen: float = 0.0
    nbest: int = 1
    sampling: bool = False
    sampling_topk: int = 0
    sampling_topp: float = 1.0
    temperature: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        if self.lenpen_style not in ("gnmt", "fairseq"):
            raise ConfigError(f"--lenpen-style {self.lenpen_style!r} must be gnmt or fairseq")
        if self.beam < 1:
            raise ConfigError(f"--beam {self.beam} must be at least 1")
        if not self.sampling and self.nbest > self.beam:
            raise ConfigError(f"--nbest {self.nbest} cannot exceed --beam {self.beam}")
        if self.temperature <= 0:
            raise ConfigError(f"--temperature {self.temperature} must be positive")
        if not 0.0 < self.sampling_topp <= 1.0:
            raise ConfigError(f"--sampling-topp {self.sampling_topp} must be in (0, 1]")


# The paper's parsing search (section 6.3): beam 21, alpha 0.3, max output length |x| + 300.
PARSE_SEARCH = SearchConfig(beam=21, lenpen=0.3, max_len_a=1.0, max_len_b=300)


@dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    save_dir: str
    arch: str = "transformer_base"
    max_tokens: int = 4096
    update_freq: int = 1
    max_update: int = 0
    max_epoch: int = 0
    max_time_minutes: float = 0.0
    lr_scheduler: str = "noam"
    warmup_updates: int = 4000
    lr: float | None = None
    lr_scale: float = 1.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    clip_norm: float = 0.0
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    seed: int = 1
    save_interval_updates: int = 0
    save_interval_minutes: float = 0.0
    keep_last: int = 0
    validate_interval_updates: int = 0
    patience: int = 0
    device: str = "auto"
    threads: int = 0
    log_interval: int = 100
    log_file: str | None = None
    bf16: bool = False
    fp16: bool = False
    max_nonfinite: int = 10
    eval_bleu: bool = False
    eval_bleu_max_tokens: int = 8000
    best_checkpoint_metric: str = "loss"
    reset_optimizer: bool = False
    reset_lr_scheduler: bool = False
    reset_dataloader: bool = False

    def __post_init__(self) -> None:
        if not (self.max_update or self.max_epoch or self.max_time_minutes):
            raise ConfigError("give a stopping rule: --max-update, --max-epoch or --max-time-minutes")
        if self.lr_scheduler not in ("noam", "inverse_sqrt"):
            raise ConfigError(f"--lr-scheduler {self.lr_scheduler!r} must be noam or inverse_sqrt")
        if self.lr_scheduler == "noam" and self.lr is not None:
            raise ConfigError("--lr sets the peak of inverse_sqrt; noam's peak follows d_model and "
                              "--warmup-updates, scale it with --lr-scale")
        if self.best_checkpoint_metric not in ("loss", "bleu"):
            raise ConfigError(f"--best-checkpoint-metric {self.best_checkpoint_metric!r} must be loss or bleu")
        if self.best_checkpoint_metric == "bleu" and not self.eval_bleu:
            raise ConfigError("--best-checkpoint-metric bleu needs --eval-bleu")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"--label-smoothing {self.label_smoothing} must be in [0, 1)")
        if self.max_tokens < 1 or self.update_freq < 1 or self.warmup_updates < 1:
            raise ConfigError("--max-tokens, --update-freq and --warmup-updates must be at least 1")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"--adam-betas {self.adam_betas} must be two numbers in [0, 1)")

    @property
    def peak_lr(self) -> float:
        return 5e-4 if self.lr is None else self.lr


def parse_betas(text: str) -> tuple[float, float]:
    """Parse '0.9,0.98' or '(0.9, 0.98)' without eval."""
    parts = [p for p in text.strip("()[] ").replace(" ", "").split(",") if p]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--adam-betas {text!r} must be two numbers like 0.9,0.98") from None
    if len(values) != 2:
        raise ConfigError(f"--adam-betas {text!r} must be two numbers like 0.9,0.98")
    return values  # type: ignore[return-value]


def config_to_dict(cfg: Any) -> dict[str, Any]:
    d = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def config_from_dict(cls: type, d: dict[str, Any], what: str) -> Any:
    """Rebuild a config saved in a checkpoint; unknown keys mean a newer nmt wrote it."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise CheckpointError(f"{what} has unknown fields {unknown}; it was written by a newer nmt")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return cls(**d)
