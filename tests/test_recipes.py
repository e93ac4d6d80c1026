"""The WMT14 EN-DE recipe end to end in SMOKE mode (a few hundred lines of ../shared/data, a tiny model) and
as a dry run; the CPU recipes' precision by CPU."""

import shutil
import subprocess

import pytest
from conftest import ROOT, SHARED_DATA, fake_cpuinfo, recipe_env


@pytest.mark.slow  # runs three or more processes (10-25 s); make test-all
@pytest.mark.skipif(
    not (SHARED_DATA / "onmt-sample" / "train.en").exists(),
    reason=f"the smoke recipe reads {SHARED_DATA}, absent on this machine",
)
def test_wmt14_en_de_smoke(tmp_path):
    env = recipe_env(SMOKE="1", WORK_DIR=str(tmp_path / "work"), SHARED=str(SHARED_DATA))
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
    # the smoke data must not feed a full run: the data steps skip what exists
    full = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wmt14_en_de" / "run.sh")],
        env={**env, "SMOKE": "0", "DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        full.returncode == 1 and "was made with SMOKE=1" in full.stderr and "this run asks for SMOKE=0" in full.stderr
    )


def test_dry_run_prints_the_papers_commands(tmp_path):
    env = recipe_env(DRY_RUN="1", GPUS="8", ARCH="big", WORK_DIR=str(tmp_path / "w"))
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


def test_a_failed_download_is_not_taken_for_data(tmp_path):
    """Multi30k fetched from the network when RAW_DIR lacks it: a failed download leaves no file that the
    next run would skip as done (it had left empty train.en / train.de, then preprocessed those)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "curl").write_text("#!/bin/sh\nexit 6\n")  # what curl says without a network
    (fake / "curl").chmod(0o755)
    env = recipe_env(RAW_DIR=str(tmp_path / "none"), WORK_DIR=str(tmp_path / "w"))
    env["PATH"] = f"{fake}:{env['PATH']}"
    for _ in range(2):
        run = subprocess.run(
            ["bash", str(ROOT / "recipes" / "multi30k_en_de" / "run.sh")], env=env, capture_output=True, text=True
        )
        assert run.returncode == 1 and "error: could not download Multi30k" in run.stderr, run.stderr
        assert "downloading Multi30k into it" in run.stderr  # the given RAW_DIR, not WORK_DIR/raw in its place
        assert not list((tmp_path / "none").glob("*.en")) and not (tmp_path / "w" / "data-bin").exists()


@pytest.mark.parametrize(("pair", "metric"), [("en_de", "tok-bleu-compound"), ("en_fr", "tok-bleu")])
def test_dry_run_scores_as_nmt_score_accepts(pair, metric, tmp_path):
    """The score step's --lang sets the Moses tokenizer of a tok-bleu metric, which `nmt score` needs beside it."""
    env = recipe_env(DRY_RUN="1", WORK_DIR=str(tmp_path / "w"))
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / f"wmt14_{pair}" / "run.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    score = next(line for line in run.stderr.splitlines() if "nmt score" in line)
    assert f"--metric {metric} --lang {pair[-2:]}" in score


@pytest.mark.parametrize(
    ("flags", "isa", "preset", "expected"),
    [
        ("fpu avx2 avx512f avx512_bf16", "", None, "--bf16"),
        ("fpu avx2 amx_bf16 amx_tile", "", None, "--bf16"),
        ("fpu avx2 fma avx512f", "", None, ""),  # AVX2 or AVX-512 without bfloat16 instructions: float32
        ("fpu avx2 avx512_bf16", "", "", ""),  # PRECISION= asks for nmt's default
        ("fpu avx2 fma", "", "--precision bf16", "--precision bf16"),
        # ONEDNN_MAX_CPU_ISA emulates an older CPU (`make test-cpus`): AVX-512 without bf16, AVX2 only; AMX's is all
        ("fpu avx2 avx512f avx512_bf16", "AVX512_CORE", None, ""),
        ("fpu avx2 amx_bf16 amx_tile", "avx2", None, ""),
        ("fpu avx2 amx_bf16 amx_tile", "AVX512_CORE_AMX", None, "--bf16"),
    ],
)
def test_cpu_recipes_train_in_bf16_only_where_the_cpu_has_bf16_instructions(tmp_path, flags, isa, preset, expected):
    env = recipe_env(CPUINFO=fake_cpuinfo(tmp_path, flags), ONEDNN_MAX_CPU_ISA=isa)
    env |= {} if preset is None else {"PRECISION": preset}
    script = f'. "{ROOT}/recipes/cpu_precision.sh"; printf "[%s]" "$PRECISION"'
    run = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert run.stdout == f"[{expected}]"


@pytest.mark.parametrize(("flags", "bf16"), [("fpu avx2 fma", False), ("fpu avx512f avx512_bf16", True)])
def test_the_demo_recipe_trains_in_float32_on_a_cpu_without_bf16(tmp_path, flags, bf16):
    """`make demo` on an AVX2-only CPU (AMD Zen 3) had trained in emulated bf16: 1 update in its 3 minutes."""
    env = recipe_env(CPUINFO=fake_cpuinfo(tmp_path, flags), DRY_RUN="1", WORK_DIR=str(tmp_path / "w"), SHOW="0")
    _, train = multi30k_dry_run(env)
    assert ("--bf16" in train.split()) == bf16


def multi30k_dry_run(env):
    """The Multi30k recipe's dry run under env: its stderr and the `nmt train` command it would run."""
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "multi30k_en_de" / "run.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stderr, next(line for line in run.stderr.splitlines() if line.startswith("+ nmt train "))


def test_multi30k_dry_run_leaves_results_and_other_settings_stop(tmp_path):
    """DRY_RUN=1 had emptied score.txt (a redirection outside run()); a rerun with another VOCAB had kept
    the data-bin of the first without a word."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "score.txt").write_text("BLEU = 39.5\n")
    raw = str(SHARED_DATA / "multi30k")
    (work / "data-bin.settings").write_text(f"VOCAB=8000 RAW_DIR={raw}\n")
    script = ["bash", str(ROOT / "recipes" / "multi30k_en_de" / "run.sh")]
    env = recipe_env(DRY_RUN="1", WORK_DIR=str(work), RAW_DIR=raw)
    run = subprocess.run(script, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (work / "score.txt").read_text() == "BLEU = 39.5\n"
    run = subprocess.run(script, env={**env, "VOCAB": "4000"}, capture_output=True, text=True)
    assert run.returncode == 1 and f"was made with VOCAB=8000 RAW_DIR={raw}; this run asks for VOCAB=4000" in run.stderr


def test_a_data_dir_without_training_files_is_named(tmp_path):
    """A DATA_DIR with valid and test but no train passed step 1 (it looked for test only); step 2 then wrote
    empty training files and preprocess blamed those."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            (data / f"{split}.{lang}").write_text("a\n")
    env = recipe_env(DATA_DIR=str(data), WORK_DIR=str(tmp_path / "w"))
    run = subprocess.run(
        ["bash", str(ROOT / "recipes" / "wmt14_en_de" / "01_download.sh")], env=env, capture_output=True, text=True
    )
    assert run.returncode == 1 and f"DATA_DIR {data} lacks train.en train.de" in run.stderr, run.stderr


@pytest.mark.parametrize(("gpu", "minutes"), [(True, "2"), (False, "60")])
def test_the_multi30k_recipe_trains_two_minutes_where_there_is_a_gpu(tmp_path, gpu, minutes):
    """On a GPU 2 minutes of training stand for the CPU's 60 (nvidia-smi -L lists a GPU; faked here)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\n" if gpu else "#!/bin/sh\nexit 9\n"
    )
    (fake / "nvidia-smi").chmod(0o755)
    env = recipe_env(DRY_RUN="1", WORK_DIR=str(tmp_path / "w"), SHOW="0")
    env["PATH"] = f"{fake}:{env['PATH']}"
    env.pop("TRAIN_MINUTES", None)
    stderr, train = multi30k_dry_run(env)
    assert f"--max-time-minutes {minutes} " in train
    assert ("a GPU is present" in stderr) == gpu


@pytest.mark.parametrize(
    ("numbered", "expected", "note"),
    [
        (7, "--inputs {d} --num-update-checkpoints 5 ", None),
        (3, "--inputs {d} --num-update-checkpoints 3 ", "{d} has 3 numbered checkpoints, fewer than the 5 to average"),
        (0, "--inputs {d}/checkpoint_last.pt --output", "{d} has no numbered checkpoint, fewer than the 5 to average"),
    ],
)
def test_a_recipe_averages_the_checkpoints_it_has(tmp_path, numbered, expected, note):
    """Where training saved fewer numbered checkpoints than N_AVERAGE in its minutes (a busy machine),
    average-checkpoints had failed; the recipes average those there are, saying so (recipes/settings.sh)."""
    d = tmp_path / "checkpoints"
    d.mkdir()
    numbered_names = [f"checkpoint_{10 * (i + 1)}.pt" for i in range(numbered)]
    for name in [*numbered_names, "checkpoint_last.pt", "checkpoint_best.pt"]:
        (d / name).touch()
    script = f'run() {{ echo "+ $*" >&2; }}; . "{ROOT}/recipes/settings.sh"; average_last "{d}" 5 "{tmp_path}/a.pt"'
    run = subprocess.run(["bash", "-euc", script], capture_output=True, text=True, timeout=30, check=True)
    assert expected.format(d=d) in run.stderr
    assert (note is None) == ("note:" not in run.stderr) and (note is None or note.format(d=d) in run.stderr)


def test_every_recipe_averages_through_average_last():
    """One copy of the rule above: no recipe calls average-checkpoints itself."""
    scripts = [p for p in (ROOT / "recipes").rglob("*.sh") if p.name != "settings.sh"]
    assert scripts and not [p for p in scripts if "average-checkpoints" in p.read_text()]


def test_the_back_translation_recipe_dry_run_prints_its_steps_and_writes_nothing(tmp_path):
    env = recipe_env(DRY_RUN="1", WORK_DIR=str(tmp_path / "w"), TRAIN_MINUTES="7", TOPK="0")
    script = ROOT / "recipes" / "multi30k_back_translation" / "run.sh"
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    commands = [line for line in run.stderr.splitlines() if line.startswith("+ ")]
    trains = [c for c in commands if c.startswith("+ nmt train ")]
    assert len(trains) == 3 and all("--max-time-minutes 7 " in c for c in trains)
    assert trains[1].endswith("--train-weights bt=0") and trains[2].endswith("--corpus-tags bt=<BT>")
    assert any("--input" in c and "mono.de" in c and "--sampling --sampling-topk 0" in c for c in commands)
    assert any(f"--trainpref real={tmp_path}/w/real,bt={tmp_path}/w/bt --tags <BT>" in c for c in commands)
    assert not list((tmp_path / "w").iterdir())


def test_make_demo_runs_the_recipe_with_the_demo_settings(tmp_path):
    """`make demo` had trained the 60-minute recipe's model for 5 minutes: 81 updates and 3.15 sacreBLEU on an AMD
    Zen 3. Its own settings (2+2 layers, 4,000 pieces, small batches, short warm-up, one validation at the end, no
    averaging) reach the recipe, in a work directory of its own, and the full recipe keeps its settings."""
    make = subprocess.run(
        ["make", "-s", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    )
    line = make.stdout[make.stdout.index("WORK_DIR=work/demo") :].split("bash ")[0].replace("\\\n", " ")
    settings = dict(word.split("=", 1) for word in line.split())
    assert settings["TRAIN_MINUTES"] == settings["SAVE_MINUTES"] == "5"
    env = recipe_env(DRY_RUN="1", SHOW="0", **{**settings, "WORK_DIR": str(tmp_path / "demo")})
    stderr, train = multi30k_dry_run(env)
    assert "--encoder-layers 2 --decoder-layers 2 --max-tokens 2048 --lr-scale 0.5" in train
    assert "--warmup-updates 150" in train and "--dropout 0.1" in train and "--save-interval-minutes 5" in train
    assert "--vocab-size 4000" in stderr and "--num-update-checkpoints 1" in stderr
    _, full = multi30k_dry_run(recipe_env(DRY_RUN="1", SHOW="0", WORK_DIR=str(tmp_path / "full")))
    assert "--encoder-layers 3 --decoder-layers 3 --max-tokens 4096 --lr-scale 1" in full
