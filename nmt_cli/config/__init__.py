"""Typed configs for every command, the architecture presets, and their validation.

Each config field is one CLI flag of the same name (`d_model` <-> `--d-model`), its default, help and bounds written
once in `flag(...)` (flags.py). Configs are frozen dataclasses of primitives, saved in checkpoints as plain dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from nmt_cli.config.inference import (
    PRECISIONS,
    GenerateConfig,
    InferenceConfig,
    ScorePairsConfig,
    ServeConfig,
    ensemble_weights,
)
from nmt_cli.config.train import TrainConfig
from nmt_cli.errors import ConfigError
from nmt_cli.flags import changed_flags, check_fields, flag, named_values

__all__ = [
    "ARCHITECTURES",
    "PARSE_SEARCH",
    "PRECISIONS",
    "SPM_TRAINING_FLAGS",
    "ExportConfig",
    "GenerateConfig",
    "InferenceConfig",
    "ModelConfig",
    "PreprocessConfig",
    "ScorePairsConfig",
    "SearchConfig",
    "ServeConfig",
    "TrainConfig",
    "config_to_dict",
    "ensemble_weights",
    "model_config",
    "named_values",
    "parses_trees",
]


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (paper Table 3 knobs). vocab_size comes from the data."""

    arch: str = flag("transformer_base", cli=False)
    vocab_size: int = flag(0, cli=False)
    encoder_layers: int = flag(6, "Encoder layers (N).", min=1)
    decoder_layers: int = flag(6, "Decoder layers (N).", min=1)
    d_model: int = flag(512, "Model width.", min=1)
    d_ff: int = flag(2048, "Feed-forward inner width.", min=1)
    heads: int = flag(8, "Attention heads (h).", min=1)
    dropout: float = flag(0.1, "Dropout on embeddings and sub-layer outputs (P_drop).", min=0, max=1, max_open=True)
    attention_dropout: float = flag(0.0, "Dropout on attention weights.", min=0, max=1, max_open=True)
    activation_dropout: float = flag(0.0, "Dropout after the feed-forward activation.", min=0, max=1, max_open=True)
    normalize_before: bool = flag(False, "Pre-norm residual blocks (the paper's is post-norm).")
    learned_pos: bool = flag(False, "Learned positions instead of sinusoids (Table 3 row E).")
    share_embeddings: bool = flag(True, "Tie source and target embeddings.")
    share_output_embed: bool = flag(True, "Tie the target embedding and the pre-softmax projection.")
    max_positions: int = flag(1024, "Longest sequence the model accepts.", min=2)
    attention_key_dim: int = flag(
        0,
        "d_k: width per head of queries and keys (Table 3 row B); values keep d_model / heads (0: d_model / heads).",
        min=0,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.d_model % self.heads:
            raise ConfigError(f"--d-model {self.d_model} must be divisible by --heads {self.heads}")


ARCHITECTURES: dict[str, ModelConfig] = {
    "transformer_base": ModelConfig(arch="transformer_base"),
    "transformer_big": ModelConfig(arch="transformer_big", d_model=1024, d_ff=4096, heads=16, dropout=0.3),
    "transformer_small": ModelConfig(
        arch="transformer_small", encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4, dropout=0.1
    ),
    "transformer_tiny": ModelConfig(
        arch="transformer_tiny",
        encoder_layers=2,
        decoder_layers=2,
        d_model=32,
        d_ff=64,
        heads=2,
        dropout=0.1,
        max_positions=256,
    ),
    # Constituency parsing, paper section 6.3: 4 + 4 layers, d_model 1024 (its search settings: PARSE_SEARCH).
    "transformer_parse": ModelConfig(
        arch="transformer_parse", encoder_layers=4, decoder_layers=4, d_model=1024, d_ff=4096, heads=16
    ),
}


def model_config(arch: str, **given: Any) -> ModelConfig:
    """The preset `arch` with every given (non-None) field applied: a flag always beats the preset."""
    if arch not in ARCHITECTURES:
        raise ConfigError(f"unknown --arch {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    return replace(ARCHITECTURES[arch], **{k: v for k, v in given.items() if v is not None})


SPM_TRAINING_FLAGS = ("--vocab-size", "--model-type", "--character-coverage", "--spm-train-sentences")


@dataclass(frozen=True)
class PreprocessConfig:
    source_lang: str = flag(help="Source language suffix, e.g. en.", short="-s")
    target_lang: str = flag(help="Target language suffix, e.g. de.", short="-t")
    trainpref: str = flag(
        help="Training text prefix: PREFIX.{src,tgt}; or several named corpora, one vocabulary: "
        "NAME=PREFIX,NAME=PREFIX (nmt train --train-weights, --corpus-tags)."
    )
    destdir: str = flag(help="Output data directory (must not exist or be empty).", path="new")
    validpref: str | None = flag(None, "Validation text prefix.")
    testpref: str | None = flag(None, "Test prefixes, comma-separated (splits test, test1, ...).")
    vocab_size: int = flag(8000, "Joint sentencepiece vocabulary size.", min=8)
    model_type: str = flag("bpe", "Sentencepiece model type.", choices=("bpe", "unigram"))
    character_coverage: float = flag(1.0, "Sentencepiece character coverage.", min=0.9, max=1.0)
    spm_model: str | None = flag(None, "Use this sentencepiece model instead of training one.", path="file")
    spm_train_sentences: int = flag(10_000_000, "At most this many lines sampled to train sentencepiece.", min=1)
    max_len: int = flag(250, "Drop training pairs longer than this (pieces).", min=1)
    max_len_ratio: float = flag(1.5, "Drop training pairs with a longer length ratio.", min=1.0)
    workers: int = flag(1, "Encoding threads.", min=1)
    tags: str | None = flag(
        None,
        "Symbols of their own for `nmt train --corpus-tags`, comma-separated (e.g. <BT>): no text encodes to "
        "them and no search outputs them.",
    )
    target_format: str = flag(
        "text",
        "ptb-tree: the target files hold one bracketed Penn Treebank tree per line "
        "(constituency parsing, nmt_cli/parsing).",
        choices=("text", "ptb-tree"),
    )
    tree_leaves: str = flag(
        "pos",
        "ptb-tree: the target's leaves are the POS tags, the placeholder XX (punctuation tags kept), "
        "each word's own pieces followed by its POS tag (words), or the same with each word's pieces right "
        "after the previous tag, before the brackets that precede it (words-ahead).",
        choices=("pos", "slot", "words", "words-ahead"),
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.source_lang == self.target_lang:
            raise ConfigError(f"--source-lang and --target-lang are both {self.source_lang!r}; they must differ")
        changed = changed_flags(self)
        spm_training = [name for name in SPM_TRAINING_FLAGS if name in changed]
        if self.spm_model is not None and spm_training:
            raise ConfigError(
                f"{' and '.join(spm_training)} train a sentencepiece model, and --spm-model gives one; "
                "drop one or the other"
            )
        if not parses_trees(self.target_format) and "--tree-leaves" in changed:
            raise ConfigError("--tree-leaves is for --target-format ptb-tree")
        if parses_trees(self.target_format) and ("=" in self.trainpref or self.tags):
            raise ConfigError("--target-format ptb-tree takes one unnamed --trainpref and no --tags")
        named_values("--tags", self.tags, named=False)


def parses_trees(target_format: str | None) -> bool:
    """The one test of the task: a target of bracketed trees (a constituency parser, nmt_cli/parsing) rather
    than text. A data directory's meta.json and a checkpoint record `target_format`; the modules that load
    them ask here once and hand the answer down."""
    return target_format == "ptb-tree"


@dataclass(frozen=True)
class SearchConfig:
    """How `generate` (and BLEU during training) searches. Saved in checkpoints."""

    beam: int = flag(4, "Beam size; 1 is greedy.", min=1)
    lenpen: float = flag(0.6, "Length penalty alpha.", min=-10, max=10)  # beyond, the penalty leaves float32
    lenpen_style: str = flag(
        "gnmt", "gnmt: ((5+|Y|)/6)^alpha (the paper's); fairseq: |Y|^alpha.", choices=("gnmt", "fairseq")
    )
    max_len_a: float = flag(1.0, "Max output length a*|x|+b.", min=0)
    max_len_b: int = flag(50, "Max output length a*|x|+b.", min=0)
    min_len: int = flag(1, "Min output length (where a*|x|+b is shorter, that ends the output).", min=0)
    unkpen: float = flag(0.0, "Subtracted from the unk log-prob.", min=-1000, max=1000)  # 1000 nats: a ban
    nbest: int = flag(1, "Hypotheses per input.", min=1)
    sampling: bool = flag(False, "Sample instead of searching.")
    sampling_topk: int = flag(0, "Sample among the k best tokens (0: all).", min=0)
    sampling_topp: float = flag(1.0, "Nucleus sampling mass.", min=0, max=1, min_open=True)
    temperature: float = flag(1.0, "Sampling temperature.", min=0.001, max=1000)  # beyond: greedy, uniform
    seed: int = flag(1, "Sampling seed.", min=0, max=2**63 - 1)  # seeds torch.Generator tells apart
    no_repeat_ngram_size: int = flag(0, "No n-gram of this many pieces occurs twice in an output (0: off).", min=0)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.sampling and self.nbest > self.beam:
            raise ConfigError(f"--nbest {self.nbest} cannot exceed --beam {self.beam}")
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise ConfigError("--max-len-a 0 and --max-len-b 0 leave no room for any output")
        if self.max_len_a == 0 and self.min_len > self.max_len_b:
            raise ConfigError(
                f"--min-len {self.min_len} exceeds every output's maximum length, --max-len-b {self.max_len_b}"
            )


# The paper's parsing search (section 6.3): beam 21, alpha 0.3, max output length |x| + 300.
PARSE_SEARCH = SearchConfig(beam=21, lenpen=0.3, max_len_a=1.0, max_len_b=300)


@dataclass(frozen=True)
class ExportConfig:
    """`nmt export`: a checkpoint as a model directory of a serving engine."""

    path: str = flag(help="Checkpoint to export.", path="file")
    output: str = flag(help="Model directory to write.", path="new")
    format: str = flag("ctranslate2", "Serving format.", choices=("ctranslate2",))
    quantization: str | None = flag(
        None,
        "Weight type of the exported model [default: float32].",
        choices=("int8", "int8_float32", "bfloat16", "float16"),
    )
    force: bool = flag(False, "Replace --output if it holds an earlier export (nothing else).")

    def __post_init__(self) -> None:
        check_fields(self)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    d = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
