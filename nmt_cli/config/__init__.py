"""Typed configs for every command, the architecture presets, and their validation.

Each config field is one CLI flag of the same name (`d_model` <-> `--d-model`): its default, help text and
allowed values are written once, here or in inference.py (generate's, serve's and score-pairs'), in the field's
metadata (`flag(...)`, flags.py); the CLI builds its options from them and `__post_init__` checks the same bounds
(flags.check_fields) when a config is built from Python. Configs are frozen dataclasses of primitives, so they
travel inside checkpoints as plain dicts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

# generate's, serve's and score-pairs' configs live in inference.py, imported from here as every other one
from nmt_cli.config.inference import (
    PRECISIONS,
    GenerateConfig,
    InferenceConfig,
    ScorePairsConfig,
    ServeConfig,
    ensemble_weights,
)
from nmt_cli.errors import ConfigError
from nmt_cli.flags import changed_flags, check_fields, flag

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
class TrainConfig:
    data_dir: str = flag(help="Data directory made by `nmt preprocess`.", path="dir", argument=True)
    save_dir: str = flag(help="Checkpoint directory; resumes from checkpoint_last.pt there.", path="new")
    max_tokens: int = flag(4096, "Padded source (and target) tokens per batch, EOS included.", min=1)
    update_freq: int = flag(1, "Batches accumulated per update.", min=1)
    max_update: int = flag(0, "Stop after this many updates (0: no limit).", min=0)
    max_epoch: int = flag(0, "Stop after this many epochs (0: no limit).", min=0)
    max_time_minutes: float = flag(0.0, "Stop after this much training wall clock (0: no limit).", min=0)
    lr_scheduler: str = flag(
        "noam", "noam: the paper's schedule; inverse_sqrt: fairseq's.", choices=("noam", "inverse_sqrt")
    )
    warmup_updates: int = flag(4000, "Warm-up updates of the schedule.", min=1)
    lr: float | None = flag(None, "Peak lr of inverse_sqrt [default: 5e-4].", min=0, min_open=True)
    lr_scale: float = flag(1.0, "Multiplies noam's lr.", min=0, min_open=True)
    adam_betas: tuple[float, float] = flag((0.9, 0.98), "Adam beta1,beta2.")
    adam_eps: float = flag(1e-9, "Adam epsilon.", min=0)
    clip_norm: float = flag(0.0, "Clip the gradient norm (0: off).", min=0)
    weight_decay: float = flag(0.0, "Decoupled weight decay.", min=0)
    ema_decay: float = flag(
        0.0,
        "Keep an exponential moving average of the weights with this decay (e.g. 0.9999; 0: off); validation, "
        "checkpoint_best.pt and every command that reads the checkpoints use the average.",
        min=0,
        max=1,
        max_open=True,
    )
    ema_start_update: int = flag(0, "The average copies the weights until this update.", min=0)
    label_smoothing: float = flag(0.1, "Label smoothing epsilon.", min=0, max=1, max_open=True)
    seed: int = flag(1, "Random seed.")
    save_interval_updates: int = flag(0, "Numbered checkpoint every N updates.", min=0)
    save_interval_minutes: float = flag(0.0, "Numbered checkpoint every M minutes.", min=0)
    keep_last: int = flag(0, "Keep the newest N numbered checkpoints (0: all).", min=0)
    validate_interval_updates: int = flag(0, "Also validate every N updates.", min=0)
    patience: int = flag(0, "Stop after N validations without improvement.", min=0)
    device: str = flag("auto", "Where to train (auto: CUDA when available).", choices=("auto", "cpu", "cuda"))
    threads: int = flag(0, "CPU threads (0: torch's default).", min=0)
    log_interval: int = flag(100, "Log every N updates.", min=1)
    log_file: str | None = flag(None, "Append every logged metric as JSON lines.", path="new")
    tensorboard_logdir: str | None = flag(
        None, "Also write the logged metrics as TensorBoard scalars here (pip install 'nmt[tensorboard]').", path="new"
    )
    precision: str | None = flag(
        None,
        "fp32, bf16 (autocast, float32 master weights) or fp16 (CUDA, loss "
        "scaling) [default: bf16 on CUDA devices that support it, else fp32].",
        choices=PRECISIONS,
    )
    max_nonfinite: int = flag(10, "Stop after this many non-finite losses in a row.", min=1)
    min_loss_scale: float = flag(1e-4, "fp16: stop when overflows push the loss scale below.", min=0, min_open=True)
    eval_bleu: bool = flag(False, "Also translate the valid split and log sacreBLEU.")
    eval_bleu_max_tokens: int = flag(8000, "Token budget of BLEU batches.", min=1)
    best_checkpoint_metric: str = flag("loss", "What checkpoint_best.pt is best at.", choices=("loss", "bleu"))
    reset_optimizer: bool = flag(False, "Do not restore the optimizer state.")
    reset_lr_scheduler: bool = flag(False, "Restart the lr schedule (the update count goes on).")
    reset_dataloader: bool = flag(False, "Restart the epoch's data order.")
    compile: bool = flag(False, "torch.compile each encoder and decoder layer (first updates slow; not saved).")
    checkpoint_activations: bool = flag(
        False, "Recompute each layer's activations in the backward pass: less memory, more compute (not saved)."
    )
    cudnn_attention: bool = flag(
        False,
        "CUDA: let attention use cuDNN's kernels, which build a plan for every new batch shape (slow with "
        "token batches; not saved) [default: flash, memory-efficient or math].",
    )
    bucket_shapes: bool = flag(
        False,
        "Pad each batch's lengths to multiples of 8 (at most 4 sizes per doubling) and take sentence counts from "
        "a grid alike, so that batch shapes repeat; the padding added is logged at the start.",
    )
    train_weights: str | None = flag(
        None,
        "NAME=W,...: an epoch draws each training corpus W times over (default 1; 0.5: a different half each "
        "epoch), by whole batches.",
    )
    corpus_tags: str | None = flag(
        None, "NAME=TAG,...: each source of corpus NAME starts with TAG, a symbol of `nmt preprocess --tags`."
    )
    cuda_graphs: bool = flag(
        False,
        "CUDA, with --bucket-shapes: capture each batch shape's forward and backward as a CUDA graph once and "
        "replay it (one process, fp32 or bf16; not saved).",
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not (self.max_update or self.max_epoch or self.max_time_minutes):
            raise ConfigError("give a stopping rule: --max-update, --max-epoch or --max-time-minutes")
        if self.lr_scheduler == "noam" and self.lr is not None:
            raise ConfigError("--lr sets inverse_sqrt's peak; noam's follows d_model and --warmup-updates (--lr-scale)")
        if self.lr_scheduler == "inverse_sqrt" and self.lr_scale != 1.0:
            raise ConfigError("--lr-scale multiplies noam's lr; inverse_sqrt's peak is --lr")
        if self.best_checkpoint_metric == "bleu" and not self.eval_bleu:
            raise ConfigError("--best-checkpoint-metric bleu needs --eval-bleu")
        if "--eval-bleu-max-tokens" in changed_flags(self) and not self.eval_bleu:
            raise ConfigError("--eval-bleu-max-tokens needs --eval-bleu")
        if "--ema-start-update" in changed_flags(self) and not self.ema_decay:
            raise ConfigError("--ema-start-update needs --ema-decay")
        self.corpus_weights(), named_values("--corpus-tags", self.corpus_tags)
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ConfigError(f"--adam-betas {self.adam_betas} must be two numbers in [0, 1)")
        if self.cuda_graphs:
            self.check_cuda_graph_options()

    def corpus_weights(self) -> dict[str, float]:
        """--train-weights by corpus name (a corpus it does not name weighs 1)."""
        weights = {}
        for name, text in named_values("--train-weights", self.train_weights).items():
            try:
                weights[name] = float(text)
            except ValueError:
                weights[name] = -1.0
            if not 0 <= weights[name] < math.inf:  # nor NaN
                raise ConfigError(f"--train-weights {name}={text}: a weight is a number >= 0")
        return weights

    def check_cuda_graph_options(self) -> None:
        """The options --cuda-graphs cannot go with (the device and the ranks: train/graphs.py)."""
        if not self.bucket_shapes:
            raise ConfigError(
                "--cuda-graphs captures a graph per batch shape and needs --bucket-shapes, which makes the shapes few "
                "(it changes the batches, so it is not implied): add --bucket-shapes"
            )
        if self.compile or self.checkpoint_activations:
            raise ConfigError(
                f"--cuda-graphs and {'--compile' if self.compile else '--checkpoint-activations'} both take over "
                "the training step: choose one"
            )
        if self.precision == "fp16":
            raise ConfigError(
                "--cuda-graphs captures fp32 or bf16 steps; fp16's loss scaling decides on the host: "
                "use --precision bf16"
            )


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


def named_values(option: str, text: str | None, named: bool = True) -> dict[str, str]:
    """`A=1,B=2` as {"A": "1", "B": "2"} (named=False: `A,B` as {"A": "A", "B": "B"}); ConfigError naming the
    option for an empty or repeated name or a missing value."""
    values: dict[str, str] = {}
    for item in text.split(",") if text is not None else []:
        name, equals, value = item.partition("=") if named else (item, "", item)
        if not name.strip() or (named and not (equals and value)) or name in values or name != name.strip():
            form = "NAME=VALUE,NAME=VALUE" if named else "comma-separated names without spaces"
            raise ConfigError(f"{option} {text!r}: {item!r} is empty, repeated or not {form}")
        values[name] = value
    return values


def config_to_dict(cfg: Any) -> dict[str, Any]:
    d = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
