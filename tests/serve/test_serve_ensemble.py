"""`nmt serve --path A.pt:B.pt`: an ensemble served (search/ensemble.py) answers as its single model does when its
members are copies of one checkpoint, and /info lists the members with their weights."""

from pathlib import Path

import pytest
import torch

from tests.serve.serving import SENTENCES, serving

pytest.importorskip("starlette")
pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def other_shape(tiny_checkpoint, tmp_path_factory) -> Path:
    """A member of tiny_checkpoint's vocabulary and another shape (a fresh model's weights)."""
    from dataclasses import asdict

    from nmt_cli.config import model_config
    from nmt_cli.model.transformer import build_model

    ckpt = torch.load(tiny_checkpoint, map_location="cpu", weights_only=True)
    cfg = model_config(
        "transformer_tiny", vocab_size=ckpt["model_config"]["vocab_size"], decoder_layers=1, max_positions=48
    )
    torch.manual_seed(2)
    ckpt["model_config"], ckpt["model"] = asdict(cfg), build_model(cfg).state_dict()
    path = tmp_path_factory.mktemp("member") / "shaped.pt"
    torch.save(ckpt, path)
    return path


def test_serve_translates_with_an_ensemble(tiny_checkpoint, other_shape):
    with serving(tiny_checkpoint) as client:
        alone = client.post("/translate", json={"texts": SENTENCES}).json()
        info = client.get("/info").json()
    assert info["checkpoint"] == str(tiny_checkpoint.resolve()) and "ensemble" not in info
    with serving(f"{tiny_checkpoint}:{tiny_checkpoint}") as client:
        twice = client.post("/translate", json={"texts": SENTENCES}).json()
        info = client.get("/info").json()
    assert [t["text"] for t in twice["translations"]] == [t["text"] for t in alone["translations"]]
    assert [t["score"] for t in twice["translations"]] == pytest.approx(
        [t["score"] for t in alone["translations"]], abs=1e-5
    )
    assert info["checkpoint"] == f"{tiny_checkpoint.resolve()}:{tiny_checkpoint.resolve()}"
    assert [(m["checkpoint"], m["weight"]) for m in info["ensemble"]] == [(str(tiny_checkpoint.resolve()), 0.5)] * 2
    with serving(f"{tiny_checkpoint}:{other_shape}", weights="1,3") as client:
        info = client.get("/info").json()
        response = client.post("/translate", json={"texts": SENTENCES})
    assert response.status_code == 200, response.text
    assert [m["weight"] for m in info["ensemble"]] == [0.25, 0.75]
    assert info["max_positions"] == 48 and info["ensemble"][1]["model"]["decoder_layers"] == 1


def test_weights_weigh_the_ensemble_served_beside_other_models(tiny_checkpoint, other_shape):
    """--weights had been checked against every --path, so an ensemble beside a single model could not be weighted;
    it weighs the ensembles, and a server of single models refuses it naming why."""
    from nmt_cli.errors import ConfigError

    with serving(tiny_checkpoint, more_paths=(f"ab={tiny_checkpoint}:{other_shape}",), weights="1,3") as client:
        one, ab = client.get("/info").json(), client.get("/info?model=ab").json()
        response = client.post("/translate", json={"text": SENTENCES[0], "model": "ab"})
    assert response.status_code == 200, response.text
    assert "ensemble" not in one and [m["weight"] for m in ab["ensemble"]] == [0.25, 0.75]
    refused = pytest.raises(ConfigError, match="--weights weighs an ensemble's checkpoints; no --path here is one")
    with refused, serving(tiny_checkpoint, more_paths=(f"b={other_shape}",), weights="1,3"):
        pass
