"""recipes/ptb_parsing in QUICK mode end to end, and recipes/wsj_parsing as a dry run."""

import runpy
import shutil
import subprocess

import pytest
from conftest import ROOT, SHARED_DATA, recipe_env


@pytest.mark.skipif(not (SHARED_DATA / "ptb-sample" / "train.tree").exists(), reason="ptb-sample is absent")
@pytest.mark.slow  # the whole recipe at QUICK sizes: preprocess, train, parse, score (25-55 s); make test-all
def test_ptb_parsing_quick(tmp_path):
    env = recipe_env(QUICK="1", WORK_DIR=str(tmp_path / "w"), THREADS="1", DATA=str(SHARED_DATA / "ptb-sample"))
    assert shutil.which("nmt", path=env["PATH"]), "the nmt command is not installed beside this python"
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "ptb_parsing" / "run.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    from nmt_cli.parsing.tree import parse_tree

    hyps = (tmp_path / "w" / "valid.hyp.tree").read_text().splitlines()
    words = (SHARED_DATA / "ptb-sample" / "valid.words").read_text().splitlines()[: len(hyps)]
    assert len(hyps) == 40
    for hyp, sentence in zip(hyps, words):
        assert parse_tree(hyp).words() == sentence.split()
    score = (tmp_path / "w" / "score.txt").read_text()
    assert "model: bracket F1 = " in score and "right-branching baseline: bracket F1 = " in score
    assert score.count("complete match = ") == 2 and "tagging accuracy = 100.00" in score  # the baseline's


def test_ptb_parsing_learning_curve_takes_the_first_train_trees(tmp_path):
    env = recipe_env(DRY_RUN="1", TRAIN_TREES="766", WORK_DIR=str(tmp_path / "w"), DATA=str(tmp_path))
    (tmp_path / "valid.tree").write_text("((S (NN a)))\n")
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "ptb_parsing" / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert f"head -n 766 '{tmp_path}/train.tree' > '{tmp_path}/w/train.tree'" in run.stderr
    assert f"--trainpref {tmp_path}/w/train " in run.stderr


@pytest.mark.parametrize(("quick", "n_average"), [("1", "2"), ("0", "5")])
def test_ptb_parsing_keeps_and_averages_its_modes_n_average(tmp_path, quick, n_average):
    """QUICK's own N_AVERAGE=2: the default 5 had been set first, so QUICK kept and averaged 5 (and failed where
    a busy machine saved 3)."""
    env = recipe_env(DRY_RUN="1", QUICK=quick, WORK_DIR=str(tmp_path / "w"), DATA=str(tmp_path))
    (tmp_path / "valid.tree").write_text("((S (NN a)))\n")
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "ptb_parsing" / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    words = run.stderr.split()
    for option in ("--keep-last", "--num-update-checkpoints"):
        assert words[words.index(option) + 1] == n_average


def test_wsj_parsing_dry_run(tmp_path):
    env = recipe_env(DRY_RUN="1", WORK_DIR=str(tmp_path / "w"), TREEBANK="/nonexistent/wsj")
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wsj_parsing" / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert any("wsj_parsing/treebank.py /nonexistent/wsj 02 21" in line for line in lines)
    assert any("treebank.py /nonexistent/wsj 23 23" in line for line in lines)
    train = next(line for line in lines if " train " in line)
    assert "--arch transformer_parse" in train
    assert any("--beam 21 --lenpen 0.3 --max-len-a 1 --max-len-b 300" in line for line in lines)
    assert any("--metric bracket-f1" in line for line in lines)
    assert not (tmp_path / "w").exists()


def test_wsj_parsing_smoke_runs_the_papers_model_on_the_sample(tmp_path):
    env = recipe_env(DRY_RUN="1", SMOKE="1", WORK_DIR=str(tmp_path / "w"), DATA="/sample")
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wsj_parsing" / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert f"+ cp /sample/train.tree {tmp_path}/w/raw/train.tree" in lines
    assert f"+ cp /sample/valid.words {tmp_path}/w/raw/test.words" in lines
    assert not any("treebank.py" in line for line in lines)
    train = next(line for line in lines if " train " in line)
    assert "--arch transformer_parse" in train and "--max-update 600" in train
    assert "--save-interval-updates 100" in train
    assert any("--beam 21 --lenpen 0.3 --max-len-a 1 --max-len-b 300" in line for line in lines)


def test_wsj_parsing_needs_the_treebank(tmp_path):
    env = recipe_env(WORK_DIR=str(tmp_path / "w"), TREEBANK=str(tmp_path / "missing"))
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wsj_parsing" / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1 and "set TREEBANK" in run.stderr


def test_split_mrg():
    split_mrg = runpy.run_path(str(ROOT / "recipes" / "wsj_parsing" / "treebank.py"))["split_mrg"]
    text = "( (S \n  (NP (NN a))\n  (VP (VBZ b))) )\n( (FRAG (NN c)) )\n"
    assert split_mrg(text) == ["((S (NP (NN a)) (VP (VBZ b))))", "((FRAG (NN c)))"]


def test_treebank_conversion_is_whole_or_nothing(tmp_path):
    """A malformed tree in a later .mrg file had left the trees read so far as OUT.tree (which the recipe
    then took for the whole split), and a parse error was a traceback naming no file."""
    main = runpy.run_path(str(ROOT / "recipes" / "wsj_parsing" / "treebank.py"))["main"]

    for section, text in (("02", "( (S (NN a) (NN b)) )\n"), ("03", "( (S (NN c)\n")):
        (tmp_path / "wsj" / section).mkdir(parents=True)
        (tmp_path / "wsj" / section / f"wsj_{section}00.mrg").write_text(text)
    out = tmp_path / "raw" / "train"
    out.parent.mkdir()
    assert main([str(tmp_path / "wsj"), "2", "3", str(out)]) == 1
    assert not list(out.parent.iterdir())
    assert main([str(tmp_path / "wsj"), "2", "2", str(out)]) == 0
    assert (tmp_path / "raw" / "train.tree").read_text() == "((S (NN a) (NN b)))\n"
    assert (tmp_path / "raw" / "train.words").read_text() == "a b\n"
