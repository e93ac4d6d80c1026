"""Dynamic int8 linear layers for CPU translation (`--quantize int8`): weights quantized once per output channel and
packed for PyTorch's int8 kernels (`int8_engine`); activations quantized per call from their own min/max; the product
back in float32 with the bias. Every projection gains, the output projection most (`benchmarks/bench_generate.py`)."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from nmt_cli.errors import ConfigError
from nmt_cli.model.linear import replace_linears
from nmt_cli.runtime import cpu_has, environment_choice

# The variable that forces the int8 kernels whatever the CPU: `fbgemm`, `onednn`, or `auto`.
ENGINE_VARIABLE = "NMT_CPU_INT8"
ENGINES = ("auto", "fbgemm", "onednn")


def engine_from_environment() -> str:
    """NMT_CPU_INT8's value (`auto` when unset); another value is a ConfigError naming the variable."""
    return environment_choice(ENGINE_VARIABLE, ENGINES)


def int8_engine() -> str:
    """The library of the int8 products: oneDNN's where the CPU has AMX (1.5-3.3x fbgemm's rate on a Xeon,
    benchmarks/record/cpu.md), fbgemm's elsewhere; NMT_CPU_INT8 forces either."""
    forced = engine_from_environment()
    if forced != "auto":
        return forced
    return "onednn" if cpu_has("amx") and "onednn" in torch.backends.quantized.supported_engines else "fbgemm"


class Int8Linear(nn.Module):
    """A frozen Linear as int8 weights (per-channel scales) packed for the engine `quantize_for_cpu_inference`
    set (`int8_engine`); float32 in and out."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors in favour of torchao
            warnings.simplefilter("ignore", UserWarning)
            q_weight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(q_weight, bias)
        self.out_features = weight.shape[0]
        # Without VNNI (AVX2 only, AVX-512 before Cascade Lake / Zen 4) the int8 kernels multiply uint8 activations
        # by int8 weights with vpmaddubsw, whose pairwise int16 sum saturates when both use the full 8-bit range:
        # 7-bit activations there, as PyTorch's own dynamic quantization (an order of magnitude smaller error).
        self.reduce_range = not cpu_has("vnni")

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [M, in]
        y = torch.ops.quantized.linear_dynamic(flat, self.packed, self.reduce_range)
        return y.view(*x.shape[:-1], self.out_features)

    def forward_relu(self, x: Tensor) -> Tensor:
        """relu(self(x)) (the feed-forward network's fc1)."""
        return torch.relu_(self(x))


def quantize_for_cpu_inference(model: nn.Module) -> nn.Module:
    """Swap every Linear of the model, the output projection included, for an Int8Linear, packed for
    `int8_engine`'s kernels.

    Raises:
        ConfigError: this PyTorch build lacks those kernels (fbgemm is x86-only).
    """
    engine = int8_engine()
    if engine not in torch.backends.quantized.supported_engines:
        raise ConfigError(
            f"--quantize int8 needs PyTorch's {engine} int8 kernels (x86 CPUs); this build has "
            f"{', '.join(torch.backends.quantized.supported_engines)}"
        )
    torch.backends.quantized.engine = engine  # Int8Linear packs its weight for the engine set here
    return replace_linears(model, Int8Linear)
