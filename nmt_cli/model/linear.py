"""Float32 matrix products on CPU through oneDNN instead of the BLAS that `torch.matmul` calls.

MKL picks its kernels by CPU vendor and runs AVX2 code on AMD's AVX-512 CPUs; oneDNN picks them by instruction set
and runs AVX-512 code there, faster on the training shapes, forward and both gradients, in float32 throughout
(`benchmarks/bench_matmul.py`). Without AVX-512 MKL's AVX2 code is the faster and this route is off (`_ONEDNN`); on
Intel's AVX-512 CPUs MKL is the faster in float32 too, so there only bfloat16 products take it (`_DTYPES`).

oneDNN builds a kernel for each new shape, and one for every batch's row count fragments the heap until the process
keeps growing (`benchmarks/bench_train.py`): row counts are padded with zero rows to a multiple of ROWS (a power of
two below it), a few dozen shapes kept in oneDNN's cache (cli/__init__.py sets its capacity).

`matmul_nt(a, b)` is `a @ b.T` by that route; `Linear` is `nn.Linear` whose forward and backward use it. Anywhere
else (CUDA, autocast, other dtypes, a torch without oneDNN) both are plain PyTorch. For translation on CPU,
`pack_for_cpu_inference` swaps the model's linears for `PackedLinear`s, whose weights oneDNN reorders once."""

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
    """NMT_CPU_MATMUL's route; a bad value falls back to `auto` here and is reported by the command line at
    start-up."""
    try:
        return route_from_environment()
    except ConfigError:
        return "auto"


def _choose_onednn(route: str) -> bool:
    """oneDNN's float32 products beat MKL's only on CPUs with AVX-512, where MKL (choosing kernels by vendor)
    runs AVX2 code on AMD's; on an AVX2-only CPU MKL is the faster (bench_matmul.py), and training's products
    keep PyTorch's default route there. NMT_CPU_MATMUL forces either route (the test suite runs both on every
    machine)."""
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
    """The dtypes whose products take the oneDNN route where it is on.

    float32 unless the CPU is Intel's and the route was not forced: MKL runs its AVX-512 code on Intel's CPUs
    and was the faster there in every product (an Intel Xeon with AMX, `bench_matmul.py`: forward 1.0-1.2x,
    input gradient 1.1-1.2x, weight gradient 1.2-1.8x oneDNN's rate; transformer_small trained 14-16% faster).
    bfloat16 only where the CPU has bf16 instructions (AVX512-BF16, AMX): on an AVX2-only CPU oneDNN has no
    bf16 inner product and PyTorch's own bf16 matmul is the one that runs; on the Xeon this route's bf16
    training was 12% faster than PyTorch's.
    """
    float32 = () if vendor == "GenuineIntel" and not forced else (torch.float32,)
    return float32 + ((torch.bfloat16,) if bf16 else ())


_ROUTE = _route()
_ONEDNN = _choose_onednn(_ROUTE)
_DTYPES = route_dtypes(_ROUTE != "auto", cpu_vendor(), cpu_has_bf16())
ROWS = 512


def on_cpu_path(a: Tensor, b: Tensor) -> bool:
    """Whether `a @ b.T` takes this module's CPU route: oneDNN, with padded row counts (the dtypes of
    `_DTYPES`, outside autocast; PyTorch's bfloat16 matmul is oneDNN already)."""
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
    """a [M, K] @ b[N, K].T (+ bias [N], then ReLU if asked) -> [M, N]; not differentiable through oneDNN
    (see Linear).

    bfloat16 products take oneDNN's linear only with a bias or a ReLU, which it applies inside the product:
    PyTorch's own bf16 addmm (oneDNN too) first copies the bias into every output row, an extra pass over
    the output, while without them it matched or beat the linear op (`benchmarks/profile_step.py`).
    """
    if on_cpu_path(a, b) and (a.dtype == torch.float32 or bias is not None or relu):
        return torch.ops.mkldnn._linear_pointwise(a, b, bias, "relu" if relu else "none", [], "")
    y = F.linear(a, b, bias)
    return torch.relu_(y) if relu else y


def weight_grad(g: Tensor, x: Tensor) -> Tensor:
    """g[M, N].T @ x[M, K] -> [N, K], a weight gradient, by the route above.

    oneDNN needs its left operand contiguous, so one of the two transposes is copied: g.T when N <= K,
    else x.T (computing the transposed product and transposing the [K, N] result back, which is the
    size of a weight). Elsewhere (CUDA) it is g.T @ x as before. Copying the smaller operand makes the
    wide products' weight gradients faster, at no loss where N <= K (`benchmarks/bench_matmul.py`).
    """
    if transposes_weight_grad(g, x):
        return matmul_nt(x.t(), g.t()).t().contiguous()
    return matmul_nt(g.t(), x.t())


def transposes_weight_grad(g: Tensor, x: Tensor) -> bool:
    """Whether weight_grad(g, x) computes the transposed product x.T @ g [K, N] and copies it back (it looks
    at the column counts N, K and the route only); a caller summing many such gradients (the loss's chunks)
    can sum the [K, N] products and transpose once."""
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
        """relu(self(x)); on the CPU route oneDNN applies the ReLU inside the product, which spares a pass
        over the [M, N] output and its allocation (the feed-forward network's fc1)."""
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
    """Whether `linear(x)` takes the padded-rows route above (a training-time Linear on CPU with oneDNN).

    Callers that chain linears (the feed-forward network, attention's output projection) then pad the
    rows once themselves: an input that already has padded_rows(M) rows is used as it is, so its padded
    copy is neither made nor saved for backward a second time.
    """
    if not (isinstance(linear, Linear) and _ONEDNN and x.device.type == "cpu" and not torch.compiler.is_compiling()):
        return False
    return product_dtype(x) in _DTYPES


def product_dtype(x: Tensor) -> torch.dtype:
    """The dtype a CPU product of `x` runs in: autocast's where it is on, else x's own."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype


def mkl_beats_onednn(weight: Tensor) -> bool:
    """Whether a frozen CPU float32 product with this [out, in] weight runs faster through MKL's sgemm than
    through oneDNN's packed product: on CPUs without AVX-512 (where training keeps MKL too, `_ONEDNN`), for
    products no wider out than in. There MKL's sgemm is the faster on the narrow products (fc2, the d x d
    attention projections), even on the wider ones and slower on the output projection, so translation is
    fastest with only the narrow products on MKL (`benchmarks/profile_generate.py`, `ab_generate.py`)."""
    return not _ONEDNN and weight.shape[1] >= weight.shape[0]


class PackedLinear(nn.Module):
    """A frozen Linear for CPU inference, its weight laid out once for the faster library: reordered
    into oneDNN's blocked layout (the op inductor's CPU freezing uses), or kept plain for MKL's sgemm where
    `mkl_beats_onednn`. Inputs and outputs stay ordinary dense tensors; either way one copy of the weight.

    In bfloat16 (translation under bf16 autocast, on CPUs with bf16 instructions) the weight is cast and
    reordered once, always for oneDNN, and each input cast to bfloat16 as autocast would: autocast itself casts
    every weight again at every step, since its cache lasts one autocast region (one step of the search).

    Against weights packed as mkldnn tensors, which need every input converted to and every output
    back from oneDNN's layout, the oneDNN route is faster, most on the output projection, since it skips
    those conversions (`benchmarks/profile_generate.py`).
    """

    def __init__(self, linear: nn.Linear, mkl: bool | None = None, dtype: torch.dtype = torch.float32) -> None:
        """mkl: the route of a float32 product (None: `mkl_beats_onednn`); dtype: the product's."""
        super().__init__()
        self.dtype = dtype
        weight = linear.weight.detach().to(dtype)
        self.mkl = dtype == torch.float32 and (mkl_beats_onednn(weight) if mkl is None else mkl)
        # The weight as its product takes it, a copy either way (plain for MKL, blocked for oneDNN): the
        # checkpoint's own pages are given back.
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
    """Swap every Linear of the model, the output projection included, for `frozen(linear)`, one layer
    at a time, giving each float32 weight's pages back once its replacement exists (a memory-mapped
    checkpoint then never has all of them resident, see allocator.release_pages)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, frozen(child))
                release_pages(child.weight)
    return model


def pack_for_cpu_inference(model: nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Swap every Linear of the model, the output projection included, for a PackedLinear of `dtype`'s products
    (float32, or bfloat16 where the CPU has bf16 instructions: `cpu_has_bf16`).

    For CPU inference only (no autograd, no autocast). At beam-search sizes (a few hundred rows) oneDNN
    with packed weights runs AVX-512 code where the default path (MKL) runs AVX2 on AMD's CPUs, so it is
    faster there, the output projection most (`benchmarks/profile_generate.py`; figures in
    benchmarks/record/cpu.md); on an AVX2-only one the narrow
    products stay with MKL (`mkl_beats_onednn`). The projection gets its own copy of the tied weight.
    """
    return replace_linears(model, lambda linear: PackedLinear(linear, dtype=dtype))
