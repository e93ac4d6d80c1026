"""Attention weights recorded from the real forward pass, and a key size d_k other than d_model / heads."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from test_transformer import batch

from nmt_cli.model.linear import pack_for_cpu_inference
from nmt_cli.model.transformer import AttentionWeights, build_model

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


@pytest.mark.parametrize("key_dim", [0, 3])
def test_recorded_weights_are_the_ones_used(tiny_model_config, key_dim):
    torch.manual_seed(0)
    model = build_model(replace(tiny_model_config, attention_key_dim=key_dim)).eval()
    src, src_pad, tgt = batch()
    plain = model(src, src_pad, tgt)
    weights = AttentionWeights()
    recorded = model(src, src_pad, tgt, weights)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    assert len(weights.encoder) == len(weights.decoder) == len(weights.cross) == 2
    assert weights.encoder[0].shape == (3, 2, 7, 7)
    assert weights.decoder[0].shape == (3, 2, 6, 6)
    assert weights.cross[0].shape == (3, 2, 6, 7)
    for w in weights.encoder + weights.decoder + weights.cross:
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    for w in weights.encoder + weights.cross:  # padded source positions get exactly 0
        assert (w.masked_select(src_pad[:, None, None, :].expand_as(w)) == 0).all()
    for w in weights.decoder:  # no weight on future target positions
        assert (w.triu(1) == 0).all()


def test_recording_changes_nothing_when_not_asked(tiny_model):
    src, src_pad, tgt = batch()
    weights = AttentionWeights()
    tiny_model(src, src_pad, tgt)
    tiny_model.encode(src, src_pad)
    assert weights == AttentionWeights()


@pytest.mark.parametrize("pack", [False, True])
def test_key_dim_decode_step_matches_full_decode(tiny_model_config, pack):
    torch.manual_seed(1)
    model = build_model(replace(tiny_model_config, attention_key_dim=5)).eval()
    assert model.encoder[0].self_attn.qkv.weight.shape == (2 * 2 * 5 + 16, 16)
    assert model.decoder[0].cross_attn.q.weight.shape == (2 * 5, 16)
    src, src_pad, tgt = batch()
    with torch.inference_mode():
        full = F.log_softmax(model(src, src_pad, tgt), dim=-1)
        if pack:
            pack_for_cpu_inference(model)
        cache = model.init_cache(model.encode(src, src_pad), 1)
        assert cache.self_k[0].shape[-1] == 5 and cache.self_v[0].shape[-1] == 8
        for t in range(tgt.shape[1]):
            step_lp, cache = model.decode_step(tgt[:, t], cache)
            assert (step_lp - full[:, t]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_attention_matches_sdpa_values_and_gradients(dtype, tol, causal):
    """On CPU `attend` writes attention out (faster there); it must be SDPA's attention, backward included."""
    from nmt_cli.model.attention import attend

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = None if causal else torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    mask = None if mask is None else mask[:, None, None, :]
    grad_out = torch.randn(3, 2, 5, 8, dtype=dtype)
    ours = attend(q, k, v, mask, causal)
    grads = torch.autograd.grad(ours, (q, k, v), grad_out)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal)
    reference_grads = torch.autograd.grad(reference, (q, k, v), grad_out.float())
    torch.testing.assert_close(ours.float(), reference, atol=tol, rtol=tol)
    for ours_g, reference_g in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(ours_g.float(), reference_g.float(), atol=tol, rtol=tol)
