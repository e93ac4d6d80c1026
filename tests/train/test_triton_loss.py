"""The CUDA route's Triton loss kernel, run on CPU by Triton's interpreter (TRITON_INTERPRET=1).

Skipped where the triton package does not import (a CPU-only PyTorch does not bring it).
"""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import ONE_ROUTE

from nmt_cli.train import loss as loss_module
from nmt_cli.train.loss import label_smoothed_nll

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


@pytest.fixture(scope="module")
def kernels():
    """train/triton_loss.py loaded afresh as a module of its own with the interpreter on (triton reads the
    variable when it decorates), so that the package's module, which CUDA training uses, is left alone."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location(
        "triton_loss_interpreted", Path(loss_module.__file__).parent / "triton_loss.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    mp.undo()


@pytest.fixture
def small_blocks(kernels, monkeypatch):
    """Blocks of 64 logits, so that a row spans several blocks and ends in a partial one."""
    monkeypatch.setattr(kernels, "BLOCK", 64)
    return kernels


@ONE_ROUTE  # the kernel against F.cross_entropy on given logits: no matrix product
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_kernel_matches_cross_entropy(small_blocks, dtype, eps):
    g = torch.Generator().manual_seed(3)
    vocab, rows = 150, 6
    z = (4 * torch.randn(rows, vocab, generator=g) + 3).to(dtype)  # a mean away from 0 for the smoothing term
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[[1, 4]] = 5  # rows with the ignored id: no loss, no gradient
    keep = target != 5
    ref_z = z.float()[keep].requires_grad_()
    ref = F.cross_entropy(ref_z, target[keep], label_smoothing=eps, reduction="sum")
    ref.backward()
    ref_nll = F.cross_entropy(ref_z.detach(), target[keep], reduction="sum")
    loss, nll = small_blocks.smoothed_ce_rows(z, target, eps, True, ignore_index=5)
    assert loss.dtype == nll.dtype == torch.float32
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    assert z.dtype == dtype and not z[~keep].any()
    # The gradient is stored in the logits' dtype: bf16 keeps 8 bits of mantissa (and Triton 3.9's interpreter
    # truncates where the GPU rounds to nearest, so a bf16 entry here can be one ulp off the CPU route's).
    torch.testing.assert_close(z[keep].float(), ref_z.grad, atol=4e-3 if dtype == torch.bfloat16 else 1e-6, rtol=0)


@ONE_ROUTE  # given logits: no matrix product
def test_kernel_without_gradient_leaves_the_logits(small_blocks):
    g = torch.Generator().manual_seed(4)
    z = torch.randn(5, 70, generator=g).to(torch.bfloat16)
    target = torch.randint(0, 70, (5,), generator=g)
    before = z.clone()
    loss, nll = small_blocks.smoothed_ce_rows(z, target, 0.1, False)
    assert torch.equal(z, before)
    ref = F.cross_entropy(z.float(), target, label_smoothing=0.1, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
def test_loss_through_the_kernel_matches_the_cpu_route(kernels, autocast, monkeypatch):
    """label_smoothed_nll with the kernel in place of PyTorch's passes (the CUDA route) against the CPU route:
    the same loss to 1e-3 relative (1e-5 measured) and the same gradients, in float32 and under bf16 autocast."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(20, 16, generator=g)
    weight = torch.randn(90, 16, generator=g)
    target = torch.randint(0, 90, (20,), generator=g)
    hidden[:, 0], weight[:, 0] = 1.0, 3.0  # logits with a mean away from 0, for the smoothing term

    def run():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, nll = label_smoothed_nll(h, w, target, 0.1)
        (2.0 * loss).backward()
        return loss, nll, h.grad, w.grad

    ref = run()
    calls = []

    def kernel(*args):
        calls.append(args[0].dtype)
        return kernels.smoothed_ce_rows(*args)

    monkeypatch.setattr(loss_module, "fused_kernel", lambda z: kernel)
    fused = run()
    assert calls == [torch.bfloat16 if autocast else torch.float32]
    assert fused[0].item() == pytest.approx(ref[0].item(), rel=1e-5)
    assert fused[1].item() == pytest.approx(ref[1].item(), rel=1e-5)
    for got, want in zip(fused[2:], ref[2:]):
        # bf16: a gradient entry rounded the other way by the two routes moves a sum by a bf16 ulp of its terms
        scale = want.abs().max().item()
        tol = {"atol": 1e-2 * scale, "rtol": 1e-2} if autocast else {"atol": 1e-5 * scale, "rtol": 1e-5}
        torch.testing.assert_close(got, want, **tol)


def test_the_kernel_serves_cuda_logits_only():
    assert loss_module.fused_kernel(torch.zeros(2, 3)) is None


def _cuda_ms(fn, repeats=10):
    fn()  # compiles the kernel, warms the allocator
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


@pytest.mark.gpu
def test_compiled_kernel_matches_the_torch_passes_on_cuda_and_beats_them():
    """The CUDA route at transformer_base's shapes (a 4k-token chunk, 37k pieces, bf16): the same sums, the
    same gradient but for bf16 rounding, in less time (printed; run with -s to see it)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    kernel = loss_module.fused_kernel(torch.empty(0, device="cuda"))
    assert kernel is not None, "triton does not import beside this CUDA build of PyTorch"
    g = torch.Generator(device="cuda").manual_seed(0)
    z = (3 * torch.randn(4096, 37000, device="cuda", generator=g)).bfloat16()
    target = torch.randint(0, 37000, (4096,), device="cuda", generator=g)
    fused, passes = z.clone(), z.clone()
    loss, nll = kernel(fused, target, 0.1, True)
    ref_loss, ref_nll = loss_module._softmax_blocks(passes, target[:, None], 0.1, True)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    assert (fused.float() - passes.float()).abs().max().item() <= 2**-8  # a bf16 ulp of the largest entries
    scratch = z.clone()
    kernel_ms = _cuda_ms(lambda: kernel(scratch, target, 0.1, True))
    passes_ms = _cuda_ms(lambda: loss_module._softmax_blocks(scratch, target[:, None], 0.1, True))
    print(f"\nloss softmax over [4096, 37000] bf16: Triton {kernel_ms:.3f} ms, PyTorch passes {passes_ms:.3f} ms")
    assert kernel_ms < passes_ms
