"""`nmt train`'s config: the run's options (the model's are ModelConfig's, config/__init__.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nmt_cli.config.inference import PRECISIONS
from nmt_cli.errors import ConfigError
from nmt_cli.flags import changed_flags, check_fields, flag, named_values


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
