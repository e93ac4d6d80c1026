"""Shared fixtures: a toy digit corpus, its data directory, a tiny model and a tiny trained checkpoint; `nmt`, the
command line run in this process."""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from nmt_cli.cli import cli
from nmt_cli.config import ARCHITECTURES, ModelConfig, PreprocessConfig, SearchConfig, TrainConfig, model_config
from nmt_cli.data.preprocess import preprocess
from nmt_cli.model import linear as _linear
from nmt_cli.model.transformer import build_model

# CTranslate2's CPU backend for the export tests: MKL, whose int8 products are exact on every x86 CPU. On
# AMD CPUs CTranslate2 4.8 picks oneDNN, whose uint8 x int8 products saturate without VNNI (AVX2 only): on
# a 2-core AMD EPYC Zen 3 the int8 export then agreed with float32 on 20 of 30 toy sentences, against 28
# with MKL. The tests check our export, not CTranslate2's backend choice; CTranslate2 reads the variable
# when it first multiplies, so it is set here, before any test runs.
os.environ.setdefault("CT2_USE_MKL", "1")

# `nmt train` options of a transformer_tiny run that takes seconds, shared by the CLI and fault tests.
TINY = [
    "--arch",
    "transformer_tiny",
    "--max-tokens",
    "256",
    "--warmup-updates",
    "4",
    "--device",
    "cpu",
    "--threads",
    "1",
    "--log-interval",
    "1",
]

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def nmt(*args: object, input: str | bytes | None = None) -> Result:
    """`nmt ARGS` (with `input` on stdin) run in this process through the click group of the `nmt` script, so that
    a user's error is its one `error:` line and exit 1 (a usage error exit 2) as a user sees it, and any other
    exception is `result.exception`, the in-process form of a traceback. A test about the process itself (signals,
    closed or full stdout, stdin closed, torchrun, start-up imports) starts `python -m nmt_cli` instead.

    The command points the `nmt_cli` logger at its captured stderr; the logger is put back as it was afterwards,
    so that later tests' records reach pytest's capture rather than a dead stream."""
    logger = logging.getLogger("nmt_cli")
    saved = logger.handlers[:], logger.level, logger.propagate
    try:
        return CliRunner().invoke(cli, [str(a) for a in args], input=input)
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def recipe_env(**kw: str) -> dict[str, str]:
    """The environment a test runs a recipe (`bash recipes/*/run.sh`) in: this python's `nmt` first on PATH,
    the checkout on PYTHONPATH, PRECISION unset (the CPU recipes choose it by CPU), then `kw`."""
    env = {k: v for k, v in os.environ.items() if k != "PRECISION"}
    paths = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    paths["PYTHONPATH"] = f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"
    return env | paths | kw


def fake_cpuinfo(tmp_path: Path, flags: str) -> str:
    """A /proc/cpuinfo of one processor with these flags, for recipes/cpu_precision.sh (CPUINFO=...)."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    return str(cpuinfo)


def write_copy_corpus(prefix: Path, n: int, seed: int, src: str = "src", tgt: str = "tgt") -> None:
    """Digit sequences; the target is the source (a copy task a tiny model can learn)."""
    rng = random.Random(seed)
    lines = [" ".join(str(rng.randrange(10)) for _ in range(rng.randint(2, 9))) for _ in range(n)]
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.{src}").write_text("\n".join(lines) + "\n")
    Path(f"{prefix}.{tgt}").write_text("\n".join(lines) + "\n")


def two_corpora_bin(root: Path, tags: str) -> Path:
    """clean (600 pairs) and bt (300) copy corpora and a valid split under root, preprocessed with `--tags tags`
    into root/bin (the data of the tests of several named corpora)."""
    write_copy_corpus(root / "clean", 600, seed=11)
    write_copy_corpus(root / "bt", 300, seed=12)
    write_copy_corpus(root / "valid", 20, seed=13)
    result = nmt(
        *("preprocess", "-s", "src", "-t", "tgt", "--trainpref", f"clean={root}/clean,bt={root}/bt"),
        *("--validpref", root / "valid", "--destdir", root / "bin", "--vocab-size", 24, "--tags", tags),
    )
    assert result.exit_code == 0, result.output
    return root / "bin"


def write_toy_corpus(root: Path) -> Path:
    write_copy_corpus(root / "train", 2000, seed=1)
    write_copy_corpus(root / "valid", 50, seed=2)
    write_copy_corpus(root / "test", 30, seed=3)
    return root


def preprocess_toy_corpus(toy_corpus: Path, dest: Path) -> Path:
    preprocess(
        PreprocessConfig(
            source_lang="src",
            target_lang="tgt",
            trainpref=str(toy_corpus / "train"),
            validpref=str(toy_corpus / "valid"),
            testpref=str(toy_corpus / "test"),
            destdir=str(dest),
            vocab_size=24,
            max_len_ratio=1.5,
        )
    )
    return dest


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory) -> Path:
    return write_toy_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def toy_data_bin(toy_corpus, tmp_path_factory) -> Path:
    return preprocess_toy_corpus(toy_corpus, tmp_path_factory.mktemp("bin") / "data-bin")


@pytest.fixture
def tiny_model_config() -> ModelConfig:
    return ModelConfig(
        arch="transformer_tiny",
        vocab_size=24,
        encoder_layers=2,
        decoder_layers=2,
        d_model=16,
        d_ff=32,
        heads=2,
        dropout=0.0,
        max_positions=64,
    )


@pytest.fixture
def tiny_model(tiny_model_config):
    torch.manual_seed(0)
    return build_model(tiny_model_config).eval()


def tiny_train_config(data_bin: Path, save_dir: Path, **kw) -> TrainConfig:
    base = dict(
        data_dir=str(data_bin),
        save_dir=str(save_dir),
        max_tokens=512,
        max_update=8,
        warmup_updates=4,
        lr_scale=1.0,
        log_interval=4,
        device="cpu",
        threads=1,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="session")
def tiny_checkpoint(toy_data_bin, tmp_path_factory) -> Path:
    """A transformer_tiny trained for a few updates on the copy corpus (fast, not converged), with checkpoint_2.pt,
    _4 and _6 beside it; trained once for all the xdist workers (`built_once`): its tests only read its directory."""
    build = functools.partial(train_tiny_model, toy_data_bin)
    return built_once(tmp_path_factory, "tiny", build) / "checkpoint_last.pt"


def train_tiny_model(toy_data_bin: Path, save_dir: Path) -> None:
    from nmt_cli.commands.train import train

    train(
        tiny_train_config(toy_data_bin, save_dir, max_update=6, save_interval_updates=2),
        ARCHITECTURES["transformer_tiny"],
        SearchConfig(),
    )


def train_copy_model(toy_data_bin: Path, save_dir: Path) -> None:
    from nmt_cli.commands.train import train

    train(
        tiny_train_config(
            toy_data_bin,
            save_dir,
            max_update=300,
            warmup_updates=100,
            max_tokens=1024,
            label_smoothing=0.0,
            log_interval=100,
        ),
        model_config("transformer_tiny", dropout=0.0),
        SearchConfig(),
    )


@pytest.fixture(scope="session")
def trained_copy_checkpoint(toy_data_bin, tmp_path_factory) -> Path:
    """A transformer_tiny that has learned the copy task well enough for non-trivial, decisive beams
    (300 updates; about 10 s on a free core), trained once for all the xdist workers (`built_once`): its tests
    only read it. Used by the slot, export parity and int8 tests, among others."""
    build = functools.partial(train_copy_model, toy_data_bin)
    return built_once(tmp_path_factory, "trained", build) / "checkpoint_last.pt"


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """A directory that `build` fills once per test session. Under pytest-xdist the workers share it: the first
    to ask builds it under a lock in the session's directory, the others wait for it and read it. Where
    NMT_TEST_BUILT names a directory, the sessions share it too: `make test` sets it, fresh, for its runs, so that
    the reruns as older CPUs read the models the first run trained (as a user's CPU reads a checkpoint trained on
    another). Only for what the tests read and never write, built from inputs every worker and session makes
    alike (the toy data's sentencepiece model is the same bytes in each)."""
    shared = os.environ.get("NMT_TEST_BUILT")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        root = Path(shared) / name
    elif "PYTEST_XDIST_WORKER" not in os.environ:  # one process: its own temporary directory
        path = tmp_path_factory.mktemp(name)
        build(path)
        return path
    else:
        root = tmp_path_factory.getbasetemp().parent / f"shared-{name}"  # the workers' common parent
    return build_locked(root, build)


def build_locked(root: Path, build: Callable[[Path], object]) -> Path:
    """`root`, filled by `build` unless a process (a worker, a session) has: the first to ask builds it under a
    lock beside it, the others wait for it."""
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / ".built").exists():  # no one has, or the one who tried failed
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            (root / ".built").touch()
    return root


def _route_params() -> list[str]:
    """The CPU matmul routes the suite runs on: both, or the one NMT_CPU_MATMUL forces (see CONTRIBUTING.md)."""
    forced = os.environ.get("NMT_CPU_MATMUL", "auto") or "auto"
    return ["onednn", "default"] if forced == "auto" else [forced]


@pytest.fixture(params=_route_params())
def cpu_matmul_route(request, monkeypatch) -> str:
    """Both CPU matmul routes of model/linear.py, whichever this machine's CPU would choose (oneDNN on AVX-512,
    PyTorch's default on AVX2-only CPUs), so each is tested on every machine. Set in this process and, through
    NMT_CPU_MATMUL, in the commands a test runs as subprocesses (torchrun ranks, recipes)."""
    from nmt_cli.model import linear
    from nmt_cli.runtime import cpu_has_bf16

    if request.param == "onednn" and not linear.ONEDNN_AVAILABLE:
        pytest.skip("this torch has no oneDNN linear op")
    monkeypatch.setattr(linear, "_ONEDNN", request.param == "onednn")
    # forced, as NMT_CPU_MATMUL forces it: float32 too whatever the vendor (on Intel's CPUs `auto` keeps MKL for it)
    monkeypatch.setattr(linear, "_DTYPES", linear.route_dtypes(forced=True, vendor="", bf16=cpu_has_bf16()))
    monkeypatch.setenv("NMT_CPU_MATMUL", request.param)
    return request.param


# The route a test runs on alone when its subject cannot depend on the matmul route (signals, process plumbing,
# collectives of plain tensors, terminal I/O): the one this machine picks, or NMT_CPU_MATMUL forces, as a user's
# run would. A test marked so says beside the mark why the route cannot matter; every other test in BOTH_ROUTES
# runs on both.
ONE_ROUTE = pytest.mark.parametrize("cpu_matmul_route", ["onednn" if _linear._ONEDNN else "default"], indirect=True)

# The packages whose tests run on both CPU matmul routes: every test module there says
# `pytestmark = pytest.mark.usefixtures("cpu_matmul_route")`, and collection fails for one that does not.
BOTH_ROUTES = ("model", "search", "train", "export")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        package = item.path.parent.name if item.path.parent.parent == ROOT / "tests" else None
        if package in BOTH_ROUTES and "cpu_matmul_route" not in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(
                f"{item.nodeid}: tests in tests/{package}/ run on both CPU matmul routes; "
                'add pytestmark = pytest.mark.usefixtures("cpu_matmul_route") to the module'
            )


@pytest.fixture
def slot_steps_taken(monkeypatch):
    """Counts the fixed-slot search's steps (Captured.step; a list that grows by one each), in every thread (serve's
    worker too)."""
    from nmt_cli.search.graphs import Captured

    calls = []
    captured_step = Captured.step
    monkeypatch.setattr(Captured, "step", lambda *a: calls.append(1) or captured_step(*a))
    return calls


if __name__ == "__main__":
    # `make test` runs this beside lint, whose mypy leaves a core free: the models the sessions will ask for, trained
    # into NMT_TEST_BUILT (built_once reads them there; a session that asks first builds one, as without this)
    shared = Path(os.environ["NMT_TEST_BUILT"])
    shared.mkdir(parents=True, exist_ok=True)
    toy = build_locked(shared / "toy", lambda d: preprocess_toy_corpus(write_toy_corpus(d / "corpus"), d / "data-bin"))
    build_locked(shared / "tiny", functools.partial(train_tiny_model, toy / "data-bin"))
    build_locked(shared / "trained", functools.partial(train_copy_model, toy / "data-bin"))
