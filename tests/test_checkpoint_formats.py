"""Checkpoints written by older nmt revisions (formats 1-3, tests/data/checkpoints/README.md) still load, translate
as they did, average and resume: each upgrade step of nmt_cli/checkpoint is run on a real file of its format."""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import nmt

from nmt_cli.checkpoint import FORMAT_VERSION, load_checkpoint, model_config_of
from nmt_cli.errors import CheckpointError

FIXTURES = Path(__file__).parent / "data" / "checkpoints"
VERSIONS = (1, 2, 3)
# The shape the fixtures were trained with (make.sh): resuming needs the same model options.
MODEL_ARGS = [
    "--arch",
    "transformer_tiny",
    "--d-model",
    16,
    "--d-ff",
    32,
    "--heads",
    2,
    "--dropout",
    0,
    "--max-positions",
    64,
]


def fixture(version: int) -> Path:
    return FIXTURES / f"v{version}.pt"


@pytest.mark.parametrize("version", VERSIONS)
def test_fixture_is_of_its_old_format(version):
    """The committed file is what that revision wrote, not a checkpoint of today's format (a remade fixture
    would stop testing the upgrade)."""
    raw = torch.load(fixture(version), map_location="cpu", weights_only=True)
    assert raw["format_version"] == version
    assert "target_format" not in raw  # format 4's field
    assert isinstance(raw["rng"], dict if version < 3 else list)
    assert ("bf16" in raw["train_config"]) == (version == 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_load_upgrades_to_the_current_format(version):
    state = load_checkpoint(fixture(version))
    assert FORMAT_VERSION == 4, "add a checkpoint of format 4 to tests/data/checkpoints and check its upgrade"
    assert state["format_version"] == FORMAT_VERSION
    train = state["train_config"]
    # v1 -> v2: --arch in the model config only; --bf16/--fp16 one precision field (v1 was trained with --bf16)
    assert not {"arch", "bf16", "fp16"} & set(train)
    assert train["precision"] == ("bf16" if version == 1 else "fp32")
    # v2 -> v3: the random streams by rank
    assert isinstance(state["rng"], list) and len(state["rng"]) == 1
    assert set(state["rng"][0]) >= {"python", "numpy", "torch"}
    # v3 -> v4: the task
    assert state["target_format"] == "text" and state["tree_leaves"] is None
    cfg = model_config_of(state, fixture(version))
    assert (cfg.d_model, cfg.encoder_layers, cfg.vocab_size, cfg.attention_key_dim) == (16, 2, 24, 0)


@pytest.mark.usefixtures("cpu_matmul_route")
@pytest.mark.parametrize("version", VERSIONS)
def test_generate_gives_the_old_revisions_hypotheses(version):
    r = nmt(
        "generate",
        "--path",
        fixture(version),
        "--input",
        FIXTURES / "test.src",
        "--beam",
        4,
        "--device",
        "cpu",
        "--threads",
        1,
    )
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == (FIXTURES / f"v{version}.hyp").read_text().splitlines()


def test_average_checkpoints_of_every_old_format(tmp_path):
    """One average of a format-1, a format-2 and a format-3 checkpoint of one model: the task and
    precision fields the upgrades add agree, and the weights are the mean."""
    out = tmp_path / "average.pt"
    r = nmt("average-checkpoints", "--inputs", *(fixture(v) for v in VERSIONS), "--output", out)
    assert r.exit_code == 0, r.output
    averaged = load_checkpoint(out)
    assert averaged["format_version"] == FORMAT_VERSION and averaged["target_format"] == "text"
    inputs = [load_checkpoint(fixture(v))["model"] for v in VERSIONS]
    for name, weight in averaged["model"].items():
        mean = sum(w[name].double() for w in inputs) / len(inputs)
        torch.testing.assert_close(weight, mean.float())


@pytest.fixture(scope="module")
def data_dir(toy_corpus, tmp_path_factory) -> Path:
    """A data directory of the copy corpus the fixtures were trained on (make.sh), made with the sentencepiece
    model they share, as resuming them needs."""
    root = tmp_path_factory.mktemp("formats")
    spm_model = root / "spm.model"
    spm_model.write_bytes(bytes(load_checkpoint(fixture(1))["spm_model"]))
    prefix = ["--trainpref", toy_corpus / "train", "--validpref", toy_corpus / "valid"]
    r = nmt("preprocess", "-s", "src", "-t", "tgt", *prefix, "--destdir", root / "bin", "--spm-model", spm_model)
    assert r.exit_code == 0, r.output
    return root / "bin"


@pytest.mark.usefixtures("cpu_matmul_route")
@pytest.mark.parametrize("version", VERSIONS)
def test_training_resumes_from_an_old_checkpoint(version, data_dir, tmp_path):
    """Old checkpoints keep their training state for resuming (v2 -> v3 turns the one random state into a
    list for it): two more updates continue the saved optimizer and counters, in today's format."""
    save = tmp_path / "ckpt"
    save.mkdir()
    shutil.copy(fixture(version), save / "checkpoint_last.pt")
    r = nmt(
        "train",
        data_dir,
        "--save-dir",
        save,
        *MODEL_ARGS,
        "--max-tokens",
        1024,
        "--warmup-updates",
        100,
        "--label-smoothing",
        0,
        "--seed",
        version,
        "--max-update",
        302,
        "--device",
        "cpu",
        "--threads",
        1,
    )
    assert r.exit_code == 0, r.output
    assert "resuming from" in r.output and "at update 300" in r.output, r.output
    old, new = load_checkpoint(fixture(version)), load_checkpoint(save / "checkpoint_last.pt")
    assert new["format_version"] == FORMAT_VERSION and new["update"] == 302
    saved, resumed = old["train_state"], new["train_state"]
    assert resumed["update"] == 302 and resumed["elapsed"] > saved["elapsed"] and resumed["epoch"] >= saved["epoch"]
    assert resumed["best"] <= saved["best"]  # the best validation loss so far carried over
    steps = {float(s["step"]) for s in new["optimizer"]["state"].values()}
    assert steps == {302.0}  # Adam's moments went on from the saved 300 steps, not afresh
    assert any(not torch.equal(w, old["model"][k]) for k, w in new["model"].items())


def test_a_checkpoint_damaged_on_disk_is_refused_naming_it(tiny_checkpoint, tmp_path):
    """torch.load does not check the zip's CRC-32s: a checkpoint with damaged tensor bytes had been loaded (and
    resumed from) silently. Now it is one error naming the file; an intact copy still loads."""
    import zipfile

    damaged = tmp_path / "damaged.pt"
    shutil.copy(tiny_checkpoint, damaged)
    with zipfile.ZipFile(damaged) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)  # a weight's bytes
    data = bytearray(damaged.read_bytes())
    head = member.header_offset  # the local header's name and extra field lengths, then the member's bytes
    start = (
        head
        + 30
        + int.from_bytes(data[head + 26 : head + 28], "little")
        + int.from_bytes(data[head + 28 : head + 30], "little")
    )
    data[start : start + 16] = bytes(16 if data[start] else [1] * 16)
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{damaged} is damaged: its part .* does not match its checksum"):
        load_checkpoint(damaged)
    assert load_checkpoint(Path(tiny_checkpoint))["model"]
    r = nmt("generate", "--path", damaged, "--input", "-", input="1 2\n")
    assert r.exit_code == 1 and "is damaged" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("kept", [0.01, 0.5, 0.999])
def test_a_truncated_checkpoint_is_said_to_be_cut_short(tiny_checkpoint, tmp_path, kept):
    """A checkpoint cut short (`head -c`: an interrupted copy, a full disk) had been "not a readable nmt checkpoint
    (RuntimeError)"; its start is a zip's, its end is missing."""
    cut = tmp_path / "cut.pt"
    data = Path(tiny_checkpoint).read_bytes()
    cut.write_bytes(data[: int(len(data) * kept)])
    with pytest.raises(CheckpointError, match=rf"{cut} is truncated: it ends before the checkpoint does"):
        load_checkpoint(cut)
    r = nmt("generate", "--path", cut, "--input", "-", input="1 2\n")
    assert r.exit_code == 1 and r.output.startswith(f"error: {cut} is truncated") and "Traceback" not in r.output
    (tmp_path / "text.pt").write_text("not a checkpoint\n")  # no zip at all: as before
    with pytest.raises(CheckpointError, match="is not a readable nmt checkpoint"):
        load_checkpoint(tmp_path / "text.pt")
