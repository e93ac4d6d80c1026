"""Opening a checkpoint for inference (search/translate.py's open_for_inference): read once, the model built on
first use, and the checks generate and serve share."""

import pytest
from click.testing import CliRunner

from nmt_cli.checkpoint import saved
from nmt_cli.cli import cli
from nmt_cli.config import GenerateConfig, InferenceConfig, ServeConfig
from nmt_cli.data import raw_text_problem
from nmt_cli.errors import ConfigError
from nmt_cli.search.translate import open_for_inference

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_generate_reads_the_checkpoint_once(tiny_checkpoint, tmp_path, monkeypatch):
    loads = []
    load = saved.load_checkpoint
    monkeypatch.setattr(saved, "load_checkpoint", lambda path: loads.append(path) or load(path))
    src = tmp_path / "in.txt"
    src.write_text("1 2 3\n4 5\n")
    r = CliRunner().invoke(cli, ["generate", "--path", str(tiny_checkpoint), "--input", str(src), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 2
    assert loads == [tiny_checkpoint]


def test_the_model_is_built_on_first_use_and_holds_the_weights(tiny_checkpoint):
    inference = open_for_inference(InferenceConfig(path=str(tiny_checkpoint), device="cpu"), {"beam": 2})
    assert inference.saved.weights and inference.search.beam == 2 and inference.precision == "fp32"
    translator = inference.translator()
    assert inference.translator() is translator
    assert inference.saved.weights == {}  # let go: the model holds its own copy
    assert (
        translator.vocab is inference.saved.vocab
        and translator.model.max_positions == inference.saved.config.max_positions
    )


@pytest.mark.parametrize("cls", [GenerateConfig, ServeConfig])
def test_generate_and_serve_refuse_int8_outside_fp32_alike(cls, tiny_checkpoint):
    with pytest.raises(ConfigError, match="--quantize int8 runs on the CPU in fp32; drop --precision bf16"):
        cls(path=str(tiny_checkpoint), quantize="int8", precision="bf16")
    assert cls(path=str(tiny_checkpoint), quantize="int8", precision="fp32").quantize == "int8"


def test_generate_and_serve_share_what_makes_a_text_unusable():
    assert raw_text_problem("1 2 3") is None
    assert raw_text_problem("\ud800 1").startswith("is not valid Unicode (an unpaired surrogate at character 0)")
    assert raw_text_problem("\u25811 \u25812").startswith("holds sentencepiece pieces")
