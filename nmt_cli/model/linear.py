"""CPU matrix products through oneDNN instead of MKL, which runs AVX2 code on AMD's AVX-512 CPUs
(`benchmarks/bench_matmul.py`). Off without AVX-512 (`_ONEDNN`); on Intel's CPUs only bfloat16 takes it (`_DTYPES`).

oneDNN builds a kernel per shape, and one per batch row count fragments the heap (`benchmarks/bench_train.py`):
row counts are padded with zero rows to a multiple of ROWS (a power of two below it). `matmul_nt` and `Linear` take
this route; `pack_for_cpu_inference` swaps a model's linears for `PackedLinear`s, weights reordered once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.allocator import release_pages
from nmt_cli.errors import ConfigError
from nmt_cli.runtime import cpu_has, cpu_has_bf16, environment_choice

# Whether this torch has oneDNN's linear op (translation's packed linears need no more).
ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# The variable that forces the route whatever the CPU: `onednn`, `default` (PyTorch's own), or `auto`.
ROUTE_VARIABLE = "NMT_CPU_MATMUL"
ROUTES = ("auto", "onednn", "default")


def route_from_environment() -> str:
    """NMT_CPU_MATMUL's value (`auto` when unset); another value is a ConfigError naming the variable."""
    return environment_choice(ROUTE_VARIABLE, ROUTES)


def _route() -> str:
    """NMT_CPU_MATMUL's route; a bad value is `auto` here (the command line reports it)."""
    try:
        return route_from_environment()
    except ConfigError:
        return "auto"


def _choose_onednn(route: str) -> bool:
    """oneDNN beats MKL only with AVX-512 (bench_matmul.py); NMT_CPU_MATMUL forces either route."""
    if route != "auto":
        return route == "onednn" and ONEDNN_AVAILABLE
    return ONEDNN_AVAILABLE and cpu_has("avx512")


def cpu_vendor() -> str:
    """The CPU's vendor as /proc/cpuinfo names it (`GenuineIntel`, `AuthenticAMD`); "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def route_dtypes(forced: bool, vendor: str, bf16: bool) -> tuple[torch.dtype, ...]:
    """The dtypes whose products take the oneDNN route where it is on: float32 unless the CPU is Intel's and
    the route not forced (MKL was the faster there in every product, `bench_matmul.py`); bfloat16 where the CPU
    has bf16 instructions (oneDNN has no bf16 inner product without them)."""
    float32 = () if vendor == "GenuineIntel" and not forced else (torch.float32,)
    return float32 + ((torch.bfloat16,) if bf16 else ())


_ROUTE = _route()
_ONEDNN = _choose_onednn(_ROUTE)
_DTYPES = route_dtypes(_ROUTE != "auto", cpu_vendor(), cpu_has_bf16())
ROWS = 512


def on_cpu_path(a: Tensor, b: Tensor) -> bool:
    """Whether `a @ b.T` takes this module's CPU route (oneDNN, padded row counts)."""
    return (
        _ONEDNN
        and a.device.type == "cpu"
        and a.dtype == b.dtype
        and a.dtype in _DTYPES
        and a.numel() > 0
        and not torch.is_autocast_enabled("cpu")
    )


def padded_rows(m: int) -> int:
    """m rounded up to a multiple of ROWS, or to a power of two when smaller."""
    return -(-m // ROWS) * ROWS if m > ROWS else 1 << max(m - 1, 0).bit_length()


def pad_rows(t: Tensor) -> Tensor:
    """t [M, K] with zero rows appended up to padded_rows(M) (t itself when already there)."""
    extra = padded_rows(t.shape[0]) - t.shape[0]
    if not extra:
        return t
    out = t.new_empty(t.shape[0] + extra, t.shape[1])
    out[: t.shape[0]] = t
    out[t.shape[0] :] = 0
    return out


def matmul_nt(a: Tensor, b: Tensor, bias: Tensor | None = None, relu: bool = False) -> Tensor:
    """a [M, K] @ b[N, K].T (+ bias [N], then ReLU if asked) -> [M, N]; not differentiable through oneDNN.

    bfloat16 takes oneDNN's linear only with a bias or ReLU, applied inside the product: PyTorch's bf16 addmm
    copies the bias into every output row first, and without them matched it (`benchmarks/profile_step.py`).
    """
    if on_cpu_path(a, b) and (a.dtype == torch.float32 or bias is not None or relu):
        return torch.ops.mkldnn._linear_pointwise(a, b, bias, "relu" if relu else "none", [], "")
    y = F.linear(a, b, bias)
    return torch.relu_(y) if relu else y


def weight_grad(g: Tensor, x: Tensor) -> Tensor:
    """g[M, N].T @ x[M, K] -> [N, K], a weight gradient. oneDNN needs its left operand contiguous, so the
    smaller transpose is copied: g.T when N <= K, else x.T, transposing the [K, N] result back (bench_matmul.py).
    """
    if transposes_weight_grad(g, x):
        return matmul_nt(x.t(), g.t()).t().contiguous()
    return matmul_nt(g.t(), x.t())


def transposes_weight_grad(g: Tensor, x: Tensor) -> bool:
    """Whether weight_grad(g, x) computes x.T @ g [K, N] and transposes it back, so that a caller summing many
    (the loss's chunks) can sum the [K, N] products and transpose once."""
    return g.shape[1] > x.shape[1] and on_cpu_path(g, x)


class _Linear(torch.autograd.Function):
    """x @ weight.T + bias, then ReLU when `relu` (the ReLU's backward is folded into this one's)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        x2 = pad_rows(flat)
        y = matmul_nt(x2, weight, bias, relu)
        ctx.save_for_backward(x2, weight, y if relu else None)
        ctx.in_shape, ctx.has_bias = x.shape, bias is not None
        return y[: flat.shape[0]].view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        x2, weight, y = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1])
        if y is not None:  # ReLU: no gradient where the output is 0
            g = torch.ops.aten.threshold_backward(g, y[: g.shape[0]], 0)
        grad_b = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        rows, g = g.shape[0], pad_rows(g)
        grad_x = matmul_nt(g, weight.t())[:rows].view(ctx.in_shape) if ctx.needs_input_grad[0] else None
        grad_w = weight_grad(g, x2) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, grad_b, None


class Linear(nn.Linear):
    """nn.Linear (same parameters and state dict) that takes the CPU route above, under autocast too."""

    def forward(self, x: Tensor) -> Tensor:
        return self._apply_linear(x, relu=False)

    def forward_relu(self, x: Tensor) -> Tensor:
        """relu(self(x)); on the CPU route the ReLU is applied inside the product (sparing a pass over the output)."""
        return self._apply_linear(x, relu=True)

    def _apply_linear(self, x: Tensor, relu: bool) -> Tensor:
        weight: Tensor = self.weight
        bias: Tensor | None = self.bias
        # Under torch.compile (`nmt train --compile`) inductor chooses the matmul kernels itself;
        # it has no lowering of the oneDNN op for dynamic shapes.
        if x.device.type == "cpu" and _ONEDNN and not torch.compiler.is_compiling():
            dtype = product_dtype(x)
            with torch.autocast("cpu", enabled=False):  # cast here, as autocast would, then leave it
                x, weight = x.to(dtype), weight.to(dtype)
                bias = None if bias is None else bias.to(dtype)
                if on_cpu_path(x, weight):
                    return _Linear.apply(x, weight, bias, relu)
        y = F.linear(x, weight, bias)
        return torch.relu(y) if relu else y


def pads_rows(linear: nn.Module, x: Tensor) -> bool:
    """Whether `linear(x)` takes the padded-rows route; callers chaining linears then pad the rows once
    themselves, so the padded copy is neither made nor saved for backward twice."""
    if not (isinstance(linear, Linear) and _ONEDNN and x.device.type == "cpu" and not torch.compiler.is_compiling()):
        return False
    return product_dtype(x) in _DTYPES


def product_dtype(x: Tensor) -> torch.dtype:
    """The dtype a CPU product of `x` runs in: autocast's where it is on, else x's own."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype


def mkl_beats_onednn(weight: Tensor) -> bool:
    """Whether a frozen float32 product with this [out, in] weight is faster through MKL's sgemm than oneDNN's:
    without AVX-512, for products no wider out than in (`benchmarks/profile_generate.py`, `ab_generate.py`)."""
    return not _ONEDNN and weight.shape[1] >= weight.shape[0]


class PackedLinear(nn.Module):
    """A frozen Linear for CPU inference, its weight laid out once: reordered into oneDNN's blocked layout, or
    kept plain for MKL's sgemm where `mkl_beats_onednn`. Inputs and outputs stay dense tensors.

    In bfloat16 the weight is cast and reordered once (always for oneDNN) and each input cast as autocast would:
    autocast recasts every weight at every step, its cache lasting one autocast region.
    """

    def __init__(self, linear: nn.Linear, mkl: bool | None = None, dtype: torch.dtype = torch.float32) -> None:
        """mkl: the route of a float32 product (None: `mkl_beats_onednn`); dtype: the product's."""
        super().__init__()
        self.dtype = dtype
        weight = linear.weight.detach().to(dtype)
        self.mkl = dtype == torch.float32 and (mkl_beats_onednn(weight) if mkl is None else mkl)
        # A copy either way, so that the checkpoint's own pages can be given back.
        self.product_weight = weight.clone() if self.mkl else torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype).clone()
        self.out_features = weight.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        return self._product(x, "none")

    def forward_relu(self, x: Tensor) -> Tensor:
        """relu(self(x)); through oneDNN the ReLU is applied inside the product (the feed-forward network's fc1)."""
        return self._product(x, "relu")

    def _product(self, x: Tensor, post_op: str) -> Tensor:
        if self.mkl:
            y = F.linear(x, self.product_weight, self.bias)
            return y.relu_() if post_op == "relu" else y
        x = x.to(self.dtype)
        rows = x.dim() == 2 and x.is_contiguous()  # the decoding step's rows: no reshaping around the product
        flat = x if rows else x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(flat, self.product_weight, self.bias, post_op, [], "")
        return y if rows else y.view(*x.shape[:-1], self.out_features)


def replace_linears(model: nn.Module, frozen: Callable[[nn.Linear], nn.Module]) -> nn.Module:
    """Swap every Linear of the model for `frozen(linear)`, giving each weight's pages back once its replacement
    exists (a memory-mapped checkpoint then never has all of them resident)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, frozen(child))
                release_pages(child.weight)
    return model


def pack_for_cpu_inference(model: nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Swap every Linear of the model for a PackedLinear of `dtype` (float32, or bfloat16 where `cpu_has_bf16`),
    for CPU inference only (no autograd, no autocast). The projection gets its own copy of the tied weight."""
    return replace_linears(model, lambda linear: PackedLinear(linear, dtype=dtype))
