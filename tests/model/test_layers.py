import pytest
import torch

from nmt_cli.model.layers import Dropout
from nmt_cli.runtime import rng_state, seed_everything, set_rng_state

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_dropout_rate_scale_and_eval():
    seed_everything(0)
    d = Dropout(0.3)
    x = torch.ones(200_000)
    y = d(x)
    keep_scale = 65536 / (65536 - 19661)  # p = 0.3 is 19661 of 65536 int16 values: 0.300003
    assert abs((y == 0).float().mean().item() - 0.3) < 0.01
    assert torch.equal(y[y != 0], torch.full_like(y[y != 0], keep_scale))
    assert abs(y.mean().item() - 1.0) < 0.01
    d.eval()
    assert d(x) is x
    x.requires_grad_()
    d.train()
    d(x).sum().backward()
    grads = x.grad.unique()
    assert len(grads) == 2 and grads[0] == 0 and grads[1].item() == pytest.approx(keep_scale, abs=1e-6)


def test_dropout_masks_follow_the_seed_and_the_saved_random_state():
    d, x = Dropout(0.1), torch.ones(3, 1001)  # not a multiple of the 4 numbers one draw gives
    seed_everything(1)
    first = d(x)
    state = rng_state()
    second = d(x)
    assert not torch.equal(first, second)
    set_rng_state(state)
    assert torch.equal(d(x), second)
    seed_everything(1)
    assert torch.equal(d(x), first)


def reference_ffn_and_attention_out(ffn, attn_out, x, y):
    """The same products through F.linear (no padded rows)."""
    import torch.nn.functional as F

    h = torch.relu(F.linear(x, ffn.fc1.weight, ffn.fc1.bias))
    merged = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    return F.linear(h, ffn.fc2.weight, ffn.fc2.bias), F.linear(merged, attn_out.weight, attn_out.bias)


def test_rows_padded_once_per_sublayer_give_the_same_values_and_gradients():
    from nmt_cli.model.attention import project_out
    from nmt_cli.model.layers import FeedForward
    from nmt_cli.model.linear import Linear

    torch.manual_seed(0)
    ffn, attn_out = FeedForward(32, 64, 0.0), Linear(32, 32)
    x = torch.randn(3, 7, 32, requires_grad=True)  # 21 rows: padded to 32 inside
    y = torch.randn(3, 4, 7, 8, requires_grad=True)  # [B, H, T, Dh]
    got = (ffn(x), project_out(attn_out, y))
    want = reference_ffn_and_attention_out(ffn, attn_out, x, y)
    params = [x, y, *ffn.parameters(), *attn_out.parameters()]
    got_grads = torch.autograd.grad(sum((g * torch.arange(g.numel()).view_as(g)).sum() for g in got), params)
    want_grads = torch.autograd.grad(sum((w * torch.arange(w.numel()).view_as(w)).sum() for w in want), params)
    for a, b in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_residual_step_is_forward_without_dropout_and_keeps_the_wider_dtype(normalize_before):
    from nmt_cli.model.layers import Residual

    torch.manual_seed(0)
    res = Residual(8, 0.3, normalize_before).eval()
    x = torch.randn(5, 8)
    linear = torch.nn.Linear(8, 8)
    torch.testing.assert_close(res.step(x, linear), res(x, linear), atol=0, rtol=0)
    # a sub-layer in a narrower dtype (as under autocast): the residual sum is not rounded to it
    narrow = res.step(x, lambda h: linear(h).bfloat16())
    assert narrow.dtype == torch.float32
    torch.testing.assert_close(narrow, res(x, lambda h: linear(h).bfloat16()), atol=0, rtol=0)
