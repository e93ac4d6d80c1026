"""The WMT14 EN-DE recipe end to end in SMOKE mode (a few hundred lines of ../shared/data, a tiny model)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not (SHARED_DATA / "onmt-sample" / "train.en").exists(),
    reason=f"the smoke recipe reads {SHARED_DATA}, absent on this machine",
)
def test_wmt14_en_de_smoke(tmp_path):
    env = {
        **os.environ,
        "SMOKE": "1",
        "WORK_DIR": str(tmp_path / "work"),
        "SHARED": str(SHARED_DATA),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    assert shutil.which("nmt", path=env["PATH"]), "the nmt command is not installed beside this python"
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wmt14_en_de" / "run.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    score = (tmp_path / "work" / "score-base.txt").read_text()
    assert score.startswith("BLEU = ") and "TOK-BLEU-COMPOUND" in score
    hyps = (tmp_path / "work" / "test-base.hyp.de").read_text().splitlines()
    assert len(hyps) == 60
    again = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wmt14_en_de" / "run.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "skipping" in again.stderr and "nothing to do" in again.stderr


def test_dry_run_prints_the_papers_commands(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "GPUS": "8", "ARCH": "big", "WORK_DIR": str(tmp_path / "w")}
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wmt14_en_de" / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    train = next(line for line in run.stderr.splitlines() if " train " in line)
    for flag in (
        "--nproc_per_node 8",
        "--arch transformer_big",
        "--dropout 0.3",
        "--max-tokens 3125",
        "--max-update 300000",
        "--warmup-updates 4000",
        "--save-interval-minutes 10",
    ):
        assert flag in train
    assert "--num-update-checkpoints 20" in run.stderr and "--lenpen 0.6" in run.stderr
    assert not (tmp_path / "w" / "data-bin").exists()
