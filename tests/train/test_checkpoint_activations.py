"""--checkpoint-activations: each encoder and decoder layer recomputed in the backward pass gives the losses and
gradients of the plain pass (dropout's masks replayed), keeps less for the backward, and leaves the random streams
where the plain pass leaves them."""

import json

import pytest
import torch
from conftest import TINY, nmt

from nmt_cli.config import model_config
from nmt_cli.model.transformer import build_model
from nmt_cli.runtime import DROPOUT_STREAM, seed_everything
from nmt_cli.train.loss import TranslationLoss

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def loss_and_gradients(model, checkpointing: bool):
    """One forward and backward of a fixed batch from the same random streams: (loss, nll, gradients by name,
    bytes autograd kept outside the checkpointed layers, the streams after)."""
    model.checkpoint_activations = checkpointing
    seed_everything(5)
    src = torch.randint(4, 24, (6, 9))
    tgt = torch.randint(4, 24, (6, 8))
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, nll = TranslationLoss(model, 0.1)(src, None, tgt[:, :-1], tgt[:, 1:])
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.item(), nll.item(), grads, sum(kept), (DROPOUT_STREAM.state, torch.get_rng_state())


def test_recomputed_layers_give_the_plain_losses_and_gradients():
    torch.manual_seed(0)
    cfg = model_config("transformer_tiny", vocab_size=24, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
    model = build_model(cfg).train()
    loss, nll, grads, kept, streams = loss_and_gradients(model, False)
    loss_c, nll_c, grads_c, kept_c, streams_c = loss_and_gradients(model, True)
    assert loss_c == pytest.approx(loss, rel=1e-5) and nll_c == pytest.approx(nll, rel=1e-5)
    for name, grad in grads.items():
        assert torch.allclose(grads_c[name], grad, rtol=1e-5, atol=1e-7 * grad.abs().max()), name
    assert kept_c < kept / 2, (kept_c, kept)  # the layers' activations are not kept for the backward
    assert streams_c[0] == streams[0] and torch.equal(streams_c[1], streams[1])
    with torch.no_grad():  # no autograd, no checkpoint: inference is untouched
        assert (
            model.checkpoint_activations
            and torch.isfinite(model(torch.tensor([[5, 6, 2]]), None, torch.tensor([[2, 5]]))).all()
        )


def test_train_with_checkpoint_activations_logs_the_plain_losses(toy_data_bin, tmp_path):
    args = ["train", toy_data_bin, *TINY, "--max-update", 3, "--dropout", 0.1, "--attention-dropout", 0.1]
    losses = {}
    for run, extra in (("plain", []), ("recomputed", ["--checkpoint-activations"])):
        log = tmp_path / f"{run}.jsonl"
        result = nmt(*args, "--save-dir", tmp_path / run, "--log-file", log, *extra)
        assert result.exit_code == 0, result.output
        losses[run] = [json.loads(line)["loss"] for line in log.read_text().splitlines() if '"train"' in line]
    assert len(losses["plain"]) == 3
    assert losses["recomputed"] == pytest.approx(losses["plain"], rel=1e-5)
