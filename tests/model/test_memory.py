"""Inference loads that do not hold the weights twice: the model built around a checkpoint's own tensors,
and the pages of memory-mapped weights given back once they are packed or quantized."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nmt_cli.allocator import release_pages
from nmt_cli.checkpoint.saved import model_around_weights
from nmt_cli.model.transformer import build_model

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def test_model_around_weights_equals_a_loaded_model_and_owns_no_meta_tensor(tiny_model_config, tmp_path):
    torch.manual_seed(0)
    reference = build_model(tiny_model_config).eval()
    torch.save(reference.state_dict(), tmp_path / "w.pt")
    weights = torch.load(tmp_path / "w.pt", mmap=True, weights_only=True)
    model = model_around_weights(tiny_model_config, weights, tmp_path / "w.pt").eval()
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.src_embed.tokens.weight.data_ptr() == weights["src_embed.tokens.weight"].data_ptr()  # no copy
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])
    tgt = torch.tensor([[0, 5, 6, 7], [0, 8, 9, 1]])
    with torch.inference_mode():
        assert torch.equal(model(src, src.eq(1), tgt), reference(src, src.eq(1), tgt))


def test_release_pages_keeps_the_data():
    t = torch.randn(1 << 20)
    before = t.clone()
    release_pages(t)  # anonymous memory: swapped out or kept, never lost
    assert torch.equal(t, before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_PAGEOUT is Linux's")
def test_release_pages_gives_back_memory_mapped_weights(tmp_path):
    torch.save({"w": torch.randn(16 << 20)}, tmp_path / "w.pt")  # 64 MiB
    w = torch.load(tmp_path / "w.pt", mmap=True, weights_only=True)["w"]
    total = float(w.sum())  # every page read: resident
    touched = resident_mb()
    release_pages(w)
    assert resident_mb() < touched - 48
    assert float(w.sum()) == total  # read again from the file


def test_building_around_weights_draws_nothing(monkeypatch):
    """No random draws on the meta device: there they import torch's reference ops (a second of start-up)."""
    from nmt_cli.config import model_config

    def refuse(*args, **kwargs):
        raise AssertionError("a random draw while building on the meta device")

    monkeypatch.setattr(torch.Tensor, "normal_", refuse)
    monkeypatch.setattr(torch, "randn_like", refuse)
    with torch.device("meta"):
        model = build_model(model_config("transformer_tiny", vocab_size=24, learned_pos=True))
    assert all(p.is_meta for p in model.parameters())
