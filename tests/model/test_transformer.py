import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from nmt_cli.config import ARCHITECTURES, model_config
from nmt_cli.data.vocab import BOS, PAD
from nmt_cli.errors import ConfigError
from nmt_cli.model.layers import sinusoidal_positions
from nmt_cli.model.transformer import build_model, count_parameters

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def closed_form_parameters(v, n_enc, n_dec, d, d_ff, normalize_before=False, heads=1, key_dim=0):
    """Paper Table 3 bookkeeping: one tied V x D embedding, 4D^2+4D per attention, 2 D d_ff + d_ff + D per FFN,
    2D per LayerNorm (+ a final LayerNorm per stack in pre-norm). With a key size d_k (row B) the Q and K
    projections are D x H*d_k each, so an attention has 2(D H d_k + H d_k) + 2(D^2 + D)."""
    qk = heads * key_dim if key_dim else d
    attention = 2 * (d * qk + qk) + 2 * (d * d + d)
    ffn = 2 * d * d_ff + d_ff + d
    norm = 2 * d
    encoder = n_enc * (attention + ffn + 2 * norm)
    decoder = n_dec * (2 * attention + ffn + 3 * norm)
    return v * d + encoder + decoder + (2 * norm if normalize_before else 0)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_parameter_count_matches_closed_form(arch):
    cfg = model_config(arch, vocab_size=37000)
    with torch.device("meta"):
        model = build_model(cfg)
    expected = closed_form_parameters(37000, cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, cfg.d_ff)
    assert count_parameters(model) == expected


@pytest.mark.parametrize("heads,key_dim", [(8, 16), (8, 32), (4, 100), (1, 512)])
def test_parameter_count_with_a_key_size(heads, key_dim):
    cfg = model_config("transformer_base", vocab_size=37000, heads=heads, attention_key_dim=key_dim)
    with torch.device("meta"):
        model = build_model(cfg)
    expected = closed_form_parameters(37000, 6, 6, 512, 2048, heads=heads, key_dim=key_dim)
    assert count_parameters(model) == expected


def test_paper_sizes():
    # Table 3: base 65M, big 213M with a 37k joint vocabulary; ours are 63.1M and 214.2M (see docs/guide.md).
    with torch.device("meta"):
        base = build_model(model_config("transformer_base", vocab_size=37000))
        big = build_model(model_config("transformer_big", vocab_size=37000))
    assert round(count_parameters(base) / 1e6, 1) == 63.1
    assert round(count_parameters(big) / 1e6, 1) == 214.2


def test_pre_norm_adds_final_layer_norms():
    cfg = model_config("transformer_tiny", vocab_size=40, normalize_before=True)
    expected = closed_form_parameters(40, 2, 2, cfg.d_model, cfg.d_ff, normalize_before=True)
    assert count_parameters(build_model(cfg)) == expected


def test_tied_weights_share_storage(tiny_model):
    m = tiny_model
    assert m.src_embed.tokens.weight.data_ptr() == m.tgt_embed.tokens.weight.data_ptr()
    assert m.output.weight.data_ptr() == m.tgt_embed.tokens.weight.data_ptr()


def test_untied_weights(tiny_model_config):
    m = build_model(replace(tiny_model_config, share_embeddings=False, share_output_embed=False))
    ptrs = {m.src_embed.tokens.weight.data_ptr(), m.tgt_embed.tokens.weight.data_ptr(), m.output.weight.data_ptr()}
    assert len(ptrs) == 3


def test_flag_beats_preset():
    cfg = model_config("transformer_big", vocab_size=100, dropout=0.1, d_model=512, heads=None)
    assert cfg.dropout == 0.1 and cfg.d_model == 512 and cfg.heads == 16 and cfg.d_ff == 4096


def test_unknown_arch_and_bad_shape():
    with pytest.raises(ConfigError, match="unknown --arch 'transformer_huge'"):
        model_config("transformer_huge", vocab_size=100)
    with pytest.raises(ConfigError, match="--d-model 500 must be divisible by --heads 8"):
        model_config("transformer_base", vocab_size=100, d_model=500)


def test_sinusoidal_positions_follow_the_paper():
    pe = sinusoidal_positions(50, 16)
    pos, i = 7, 3
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)


def batch(b=3, s=7, t=6, vocab=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    src_pad = torch.zeros(b, s, dtype=torch.bool)
    src_pad[1, 5:] = True
    src_pad[2, 3:] = True
    src = src.masked_fill(src_pad, PAD)
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    tgt[:, 0] = BOS
    return src, src_pad, tgt


def test_shapes(tiny_model):
    src, src_pad, tgt = batch()
    enc = tiny_model.encode(src, src_pad)
    assert enc.memory.shape == (3, 7, 16)
    assert tiny_model.decode(tgt, enc).shape == (3, 6, 16)
    assert tiny_model(src, src_pad, tgt).shape == (3, 6, 24)


def test_padding_does_not_change_encoder_outputs(tiny_model):
    src, src_pad, _ = batch()
    out = tiny_model.encode(src, src_pad).memory
    wider = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    wider_pad = torch.cat([src_pad, torch.ones(3, 4, dtype=torch.bool)], dim=1)
    out_wide = tiny_model.encode(wider, wider_pad).memory
    real = ~src_pad
    torch.testing.assert_close(out_wide[:, :7][real], out[real], atol=1e-5, rtol=1e-5)
    alone = tiny_model.encode(src[2:, :3], src_pad[2:, :3]).memory
    torch.testing.assert_close(alone[0], out[2, :3], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("grad", [False, True])
def test_decode_step_matches_full_decode(tiny_model_config, normalize_before, beam, grad, cpu_matmul_route):
    """With grad mode on too (research code, a sequence-level loss): the step's in-place shortcuts (the residual,
    the log-softmax) must then leave autograd's tensors alone, and the step's gradient must be the full one's."""
    torch.manual_seed(1)
    model = build_model(replace(tiny_model_config, normalize_before=normalize_before)).eval()
    src, src_pad, tgt = batch()
    with torch.set_grad_enabled(grad):
        enc = model.encode(src, src_pad)
        tgt = tgt.repeat_interleave(beam, dim=0)  # rows b*K+k, as in beam search
        full = F.log_softmax(model(src.repeat_interleave(beam, 0), src_pad.repeat_interleave(beam, 0), tgt), dim=-1)
        cache = model.init_cache(enc, beam)
        for t in range(tgt.shape[1]):
            step_lp, cache = model.decode_step(tgt[:, t], cache)
            assert (step_lp - full[:, t]).abs().max().item() <= 1e-5
    if grad:
        (step_grad,) = torch.autograd.grad(step_lp.sum(), model.tgt_embed.tokens.weight)
        (full_grad,) = torch.autograd.grad(full[:, -1].sum(), model.tgt_embed.tokens.weight)
        torch.testing.assert_close(step_grad, full_grad, atol=1e-4, rtol=1e-4)


def test_attention_matches_manual_formula():
    from nmt_cli.model.attention import SelfAttention

    torch.manual_seed(0)
    attn = SelfAttention(8, 2, 0.0).eval()
    x = torch.randn(2, 5, 8)
    q, k, v = (w.view(2, 5, 2, 4).transpose(1, 2) for w in attn.qkv(x).chunk(3, -1))
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4), dim=-1)
    expected = attn.out((weights @ v).transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(attn(x), expected, atol=1e-6, rtol=1e-5)


def test_attention_bias_masks_like_the_boolean_mask():
    from nmt_cli.model.attention import attend_explicit, attention_bias, attention_mask

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    src_pad_mask = torch.tensor([[False] * 5, [False, False, False, True, True]])
    by_mask, weights = attend_explicit(q, k, v, attention_mask(src_pad_mask))
    by_bias, bias_weights = attend_explicit(q, k, v, attention_bias(src_pad_mask, torch.float32))
    torch.testing.assert_close(by_bias, by_mask, atol=0, rtol=0)
    assert (bias_weights[1, :, :, 3:] == 0).all() and (weights[1, :, :, 3:] == 0).all()
    assert attention_bias(None, torch.float32) is None
