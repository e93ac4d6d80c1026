import torch

from nmt_cli.model.layers import Dropout


def test_dropout_rate_scale_and_eval():
    torch.manual_seed(0)
    d = Dropout(0.3)
    x = torch.ones(200_000)
    y = d(x)
    assert abs((y == 0).float().mean().item() - 0.3) < 0.01
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.7))
    assert abs(y.mean().item() - 1.0) < 0.01
    d.eval()
    assert d(x) is x
    x.requires_grad_()
    d.train()
    d(x).sum().backward()
    grads = x.grad.unique()
    assert len(grads) == 2 and grads[0] == 0 and abs(grads[1].item() - 1 / 0.7) < 1e-6
