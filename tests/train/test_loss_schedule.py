import pytest
import torch
import torch.nn.functional as F

from nmt_cli.train.loss import label_smoothed_nll
from nmt_cli.train.schedule import learning_rate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_label_smoothing_by_hand():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    target = torch.tensor([1])
    lp = torch.log_softmax(logits, -1)[0]
    eps = 0.1
    q = torch.full((3,), eps / 3)
    q[1] += 1 - eps
    loss, nll = label_smoothed_nll(logits, torch.eye(3), target, eps)
    assert loss.item() == pytest.approx(-(q * lp).sum().item(), abs=1e-6)
    assert nll.item() == pytest.approx(-lp[1].item(), abs=1e-6)


def test_matches_torch_cross_entropy_and_nll_at_zero():
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(20, 11, generator=g), torch.randint(0, 11, (20,), generator=g)
    eye = torch.eye(11)
    loss, nll = label_smoothed_nll(logits, eye, target, 0.1)
    assert loss.item() == pytest.approx(
        F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum").item(), rel=1e-6
    )
    loss0, nll0 = label_smoothed_nll(logits, eye, target, 0.0)
    assert (
        loss0.item()
        == pytest.approx(nll0.item())
        == pytest.approx(F.nll_loss(logits.log_softmax(-1), target, reduction="sum").item(), rel=1e-6)
    )


@pytest.mark.parametrize("step", [1, 10, 1000, 4000, 4001, 10000, 100000])
def test_noam_is_the_papers_formula(step):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert learning_rate(step, "noam", 512, 4000, 1.0, 0) == pytest.approx(expected)
    assert learning_rate(step, "noam", 512, 4000, 2.0, 0) == pytest.approx(2 * expected)


@pytest.mark.parametrize("scheduler", ["noam", "inverse_sqrt"])
def test_schedule_peaks_at_warmup(scheduler):
    lrs = [learning_rate(s, scheduler, 512, 100, 1.0, 1e-3) for s in range(1, 400)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 100


def test_inverse_sqrt():
    assert learning_rate(50, "inverse_sqrt", 512, 100, 1.0, 1e-3) == pytest.approx(5e-4)
    assert learning_rate(400, "inverse_sqrt", 512, 100, 1.0, 1e-3) == pytest.approx(5e-4)
    assert learning_rate(100, "noam", 512, 100, 1.0, 0) == pytest.approx(512**-0.5 * 100**-0.5)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_elements", [17, 5 * 17, 1 << 21])
@pytest.mark.parametrize("rows", [13, 1100])  # 1100: chunks of ROWS rows and a padded last one on CPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # float64: the unpadded chunking
def test_fused_gradient_matches_autograd(eps, chunk_elements, rows, dtype, monkeypatch, cpu_matmul_route):
    from nmt_cli.train import loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_elements)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(rows, 6, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(17, 6, generator=g, dtype=dtype).requires_grad_()
    target = torch.randint(0, 17, (rows,), generator=g)
    loss, nll = label_smoothed_nll(hidden, weight, target, eps)
    (3.0 * loss).backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_h @ ref_w.t(), target, label_smoothing=eps, reduction="sum")
    (3.0 * ref).backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert nll.item() == pytest.approx(F.cross_entropy(ref_h @ ref_w.t(), target, reduction="sum").item(), rel=1e-5)
    torch.testing.assert_close(hidden.grad, ref_h.grad, atol=1e-5, rtol=1e-5)
    # The weight's gradient sums over all rows in float32.
    torch.testing.assert_close(weight.grad, ref_w.grad, atol=1e-5 * max(1, rows / 100), rtol=1e-5)


@pytest.mark.parametrize("rows", [13, 1100])
def test_fused_gradient_under_bf16_autocast_matches_float32(rows, monkeypatch, cpu_matmul_route):
    """bf16 logits, float32 sums: the weight gradient (summed as [D, V] products on CPU) is contiguous
    and close to the float32 one."""
    from nmt_cli.train import loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 5 * 40)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(rows, 8, generator=g).requires_grad_()
    weight = torch.randn(40, 8, generator=g).requires_grad_()
    target = torch.randint(0, 40, (rows,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = label_smoothed_nll(hidden, weight, target, 0.1)
    loss.backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    F.cross_entropy(ref_h @ ref_w.t(), target, label_smoothing=0.1, reduction="sum").backward()
    assert weight.grad.is_contiguous() and weight.grad.dtype == torch.float32
    scale = ref_w.grad.abs().max().item()
    torch.testing.assert_close(weight.grad, ref_w.grad, atol=0.02 * scale, rtol=0.02)
    torch.testing.assert_close(hidden.grad, ref_h.grad, atol=0.02 * ref_h.grad.abs().max().item(), rtol=0.02)
