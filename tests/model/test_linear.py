"""The CPU route of model/linear.py gives what F.linear gives, values and gradients."""

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.model import linear
from nmt_cli.model.linear import ONEDNN_AVAILABLE, ROWS, Linear, PackedLinear, matmul_nt, padded_rows, weight_grad
from nmt_cli.model.quantize import Int8Linear, int8_engine
from nmt_cli.runtime import cpu_has, cpu_has_bf16

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # every test on both routes


def test_padded_rows_are_few_shapes():
    assert [padded_rows(m) for m in (1, 3, 200, ROWS, ROWS + 1, 5 * ROWS - 7)] == [1, 4, 256, ROWS, 2 * ROWS, 5 * ROWS]
    assert len({padded_rows(m) for m in range(1, 4097)}) == 10 + 7  # powers of two to ROWS, then multiples


@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 8), (ROWS + 3, 8), (2, 400, 8)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_f_linear_forward_and_backward(shape, bias):
    torch.manual_seed(0)
    layer = Linear(8, 24, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    y = layer(x)
    ref_x = x.detach().clone().requires_grad_()
    ref_w = layer.weight.detach().clone().requires_grad_()
    ref_b = layer.bias.detach().clone().requires_grad_() if bias else None
    ref = F.linear(ref_x, ref_w, ref_b)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    upstream = torch.randn_like(ref)
    y.backward(upstream)
    ref.backward(upstream)
    torch.testing.assert_close(x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.weight.grad, ref_w.grad, atol=1e-4, rtol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad, ref_b.grad, atol=1e-5, rtol=1e-5)


def test_linear_under_bf16_autocast_behaves_like_autocast():
    torch.manual_seed(0)
    layer = Linear(16, 32)
    x = torch.randn(700, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        ref = F.linear(x, layer.weight, layer.bias)
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and torch.isfinite(layer.weight.grad).all()


def test_matmul_nt_is_a_times_b_transposed():
    a, b = torch.randn(37, 9), torch.randn(11, 9)
    torch.testing.assert_close(matmul_nt(a, b), a @ b.t(), atol=1e-5, rtol=1e-5)
    c = torch.randn(9, 37)
    torch.testing.assert_close(matmul_nt(c.t(), b.t().contiguous().t()), c.t() @ b.t(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_out, n_in", [(48, 16), (16, 48), (32, 32)])
def test_weight_grad_is_g_transposed_times_x_whichever_transpose_is_copied(n_out, n_in):
    torch.manual_seed(0)
    g, x = torch.randn(37, n_out), torch.randn(37, n_in)
    got = weight_grad(g, x)
    assert got.shape == (n_out, n_in) and got.is_contiguous()
    torch.testing.assert_close(got, g.t() @ x, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [5, ROWS + 3])
@pytest.mark.parametrize("autocast", [False, True])
def test_forward_relu_is_relu_of_forward_values_and_gradients(rows, autocast):
    torch.manual_seed(0)
    layer = Linear(16, 40)
    x = torch.randn(rows, 16, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    ref_w = layer.weight.detach().clone().requires_grad_()
    ref_b = layer.bias.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer.forward_relu(x)
        ref = torch.relu(F.linear(ref_x, ref_w, ref_b))
    assert y.dtype == ref.dtype and (y == 0).any()
    tol = 2e-2 if autocast else 1e-5
    torch.testing.assert_close(y.float(), ref.float(), atol=tol, rtol=tol)
    upstream = torch.randn(rows, 40)
    (y.float() * upstream).sum().backward()
    (ref.float() * upstream).sum().backward()
    for got, want in ((x.grad, ref_x.grad), (layer.weight.grad, ref_w.grad), (layer.bias.grad, ref_b.grad)):
        torch.testing.assert_close(got, want, atol=tol * max(1.0, want.abs().max().item()), rtol=tol)


@pytest.mark.skipif(not ONEDNN_AVAILABLE, reason="this torch build has no oneDNN linear op")
@pytest.mark.parametrize("mkl", [False, True])
def test_packed_linear_gives_the_linear_and_its_relu(mkl):
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 40)
    packed = PackedLinear(layer, mkl=mkl)
    assert packed.mkl == mkl
    x = torch.randn(3, 7, 16)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), layer(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed.forward_relu(x), torch.relu(layer(x)), atol=1e-5, rtol=1e-5)
        assert (packed.forward_relu(x) == 0).any()  # the ReLU did something


@pytest.mark.parametrize("avx512", [False, True])
def test_translation_products_take_mkl_only_where_narrow_on_avx2_cpus(monkeypatch, avx512):
    """On AVX2-only CPUs (no oneDNN training route) products no wider out than in go to MKL, others to
    oneDNN; on AVX-512 CPUs all to oneDNN."""
    monkeypatch.setattr(linear, "_ONEDNN", avx512)
    fc2, square, fc1 = torch.empty(16, 64), torch.empty(16, 16), torch.empty(64, 16)
    assert [linear.mkl_beats_onednn(w) for w in (fc2, square, fc1)] == ([False] * 3 if avx512 else [True, True, False])


def test_float32_keeps_mkl_on_intel_unless_forced():
    """`auto` on an Intel CPU: bfloat16 products through oneDNN, float32 ones through MKL, which runs its AVX-512
    code there; on AMD's CPUs (MKL's AVX2 code) and when forced, float32 through oneDNN too."""
    f32, bf16 = torch.float32, torch.bfloat16
    assert linear.route_dtypes(False, "GenuineIntel", True) == (bf16,)
    assert linear.route_dtypes(False, "GenuineIntel", False) == ()
    assert linear.route_dtypes(True, "GenuineIntel", True) == (f32, bf16)
    assert linear.route_dtypes(False, "AuthenticAMD", True) == (f32, bf16)
    assert linear.route_dtypes(False, "AuthenticAMD", False) == linear.route_dtypes(False, "", False) == (f32,)


class LinearOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts oneDNN's linear op among the ops run."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is torch.ops.mkldnn._linear_pointwise.default
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not ONEDNN_AVAILABLE, reason="this torch build has no oneDNN linear op")
def test_the_route_takes_only_its_dtypes(monkeypatch):
    """Intel's `auto` on this CPU: bfloat16 alone on the route where the CPU has bf16 instructions, nothing where
    not (oneDNN has no bf16 product on an AVX2-only CPU). A float32 layer runs F.linear, unpadded; under bf16
    autocast the route's padded rows and oneDNN's op where bf16 is on it; all give F.linear's values and
    gradients."""
    monkeypatch.setattr(linear, "_ONEDNN", True)
    monkeypatch.setattr(linear, "_DTYPES", linear.route_dtypes(False, "GenuineIntel", cpu_has_bf16()))
    torch.manual_seed(0)
    layer, x = Linear(16, 40), torch.randn(5, 16, requires_grad=True)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), LinearOps() as ops:
            padded = linear.pads_rows(layer, x)
            y = layer(x)
            y.float().sum().backward()
            ref = F.linear(x, layer.weight, layer.bias)
        assert padded == (ops.n > 0) == (autocast and cpu_has_bf16())
        tol = 2e-2 if autocast else 1e-6
        torch.testing.assert_close(y.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.skipif(
    not {"fbgemm", "onednn"} <= set(torch.backends.quantized.supported_engines), reason="int8 kernels of x86"
)
@pytest.mark.parametrize(
    ("variables", "capability", "has"),
    [
        ({}, "AVX512", {"avx512", "vnni", "amx"}),
        ({"ONEDNN_MAX_CPU_ISA": "ALL"}, "AVX512", {"avx512", "vnni", "amx"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "AVX512", {"avx512", "vnni", "amx"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "AVX512", {"avx512", "vnni"}),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "AVX512", {"avx512"}),
        ({"FBGEMM_ENABLE_INSTRUCTIONS": "AVX512"}, "AVX512", {"avx512", "amx"}),
        ({"ONEDNN_MAX_CPU_ISA": "avx2"}, "AVX512", set()),
        ({}, "AVX2", set()),  # ATEN_CPU_CAPABILITY=avx2, or an AVX2-only CPU
    ],
)
def test_cpu_features_are_the_emulated_cpus(monkeypatch, variables, capability, has):
    """Where ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY or FBGEMM_ENABLE_INSTRUCTIONS caps the libraries (`make
    test-cpus`), nmt's choices see that CPU, on a CPU with all of them (torch.cpu's checks see its flags)."""
    for name in ("ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "NMT_CPU_INT8"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert {feature for feature in ("avx512", "vnni", "amx") if cpu_has(feature)} == has
    assert linear._choose_onednn("auto") == ("avx512" in has and ONEDNN_AVAILABLE)
    assert int8_engine() == ("onednn" if "amx" in has else "fbgemm")
    assert Int8Linear(torch.nn.Linear(4, 4)).reduce_range == ("vnni" not in has)


@pytest.mark.skipif(not ONEDNN_AVAILABLE or not cpu_has_bf16(), reason="needs oneDNN and a CPU with bf16 instructions")
@pytest.mark.parametrize("rows", [1, 37, 256])
def test_bf16_packed_linear_gives_autocasts_products(rows):
    """bfloat16 weights packed once: what F.linear gives under bf16 autocast, to a bf16 rounding."""
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 200), torch.randn(rows, 64)
    packed = PackedLinear(layer, mkl=True, dtype=torch.bfloat16)  # a bf16 product always takes oneDNN
    assert not packed.mkl and packed.product_weight.dtype == torch.bfloat16
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.linear(x, layer.weight, layer.bias)
        got, got_relu = packed(x), packed.forward_relu(x)
    assert got.dtype == got_relu.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_relu, torch.relu(want), atol=1e-2, rtol=1e-2)
