"""Data-parallel training on CPU with gloo and 2 processes under torchrun."""

import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from conftest import ONE_ROUTE, TINY

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.cli import cli

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

COMMON = [*TINY, "--dropout", "0"]  # dropout off: ranks and processes give equal numbers


def train_cmd(data_bin, save_dir, *extra, ranks=1):
    """`nmt train` of the tiny model, under torchrun when ranks > 1."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--standalone"]
        if ranks > 1
        else [sys.executable]
    )
    return [*launcher, "-m", "nmt_cli", "train", str(data_bin), "--save-dir", str(save_dir), *COMMON, *extra]


def launcher_env(directory, **extra):
    """The environment of a run under torchrun, whose log directories (torchelastic_*, left behind by a killed
    run) go to the test's `directory` instead of /tmp."""
    return {**os.environ, "TMPDIR": str(directory), **extra}


def nmt(data_bin, save_dir, *extra, ranks=1):
    result = subprocess.run(
        train_cmd(data_bin, save_dir, *extra, ranks=ranks),
        capture_output=True,
        text=True,
        timeout=120,
        env=launcher_env(save_dir.parent),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_same_parameters(a, b, atol):
    for name, tensor in a["model"].items():
        torch.testing.assert_close(tensor, b["model"][name], atol=atol, rtol=0, msg=name)


@ONE_ROUTE  # each batch meets the same products in the ranks and in the one process: the subject is their sum
def test_two_ranks_equal_one_process_with_update_freq_2_and_stop_on_rank_0s_clock(toy_data_bin, tmp_path):
    """Two ranks train what one process does with --update-freq 2. And --max-time-minutes and timed saves follow
    rank 0's clock on every rank: rank 1's clock runs an hour ahead a second here (faults.py), and ranks whose
    clocks disagreed at the limit used to stop at different updates, the rest waiting in a collective for the one
    gone. One torchrun run holds both: each rank starts a Python with torch, the most of this test's time."""
    # the one process is this one (the subject is what the ranks compute, and torchrun starts them)
    args = ["train", str(toy_data_bin), "--save-dir", str(tmp_path / "single"), *COMMON]
    result = CliRunner().invoke(cli, [*args, "--max-update", "6", "--update-freq", "2"])
    assert result.exit_code == 0, result.output
    timed = ["--max-time-minutes", "10", "--save-interval-minutes", "5"]
    two = faulty_run(toy_data_bin, tmp_path / "ddp", "clock:1:0", "--max-update", "6", *timed)
    assert two.returncode == 0, two.stderr[-3000:]
    single = load_checkpoint(tmp_path / "single" / "checkpoint_last.pt")
    ddp = load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")
    assert single["update"] == ddp["update"] == 6 and ddp["world_size"] == 2
    assert_same_parameters(single, ddp, atol=1e-5)
    assert two.stderr.count("train | update 1 ") == 1  # only rank 0 logs
    assert "reached --max-update 6" in two.stderr
    assert [p.name for p in (tmp_path / "ddp").glob("checkpoint_[0-9]*.pt")] == ["checkpoint_6.pt"]  # no timed saves


@pytest.mark.slow  # runs three or more processes (10-25 s); make test-all
def test_two_ranks_resume_and_finish(toy_data_bin, tmp_path):
    nmt(toy_data_bin, tmp_path / "whole", "--max-update", "6", ranks=2)
    nmt(toy_data_bin, tmp_path / "parts", "--max-update", "3", ranks=2)
    resumed = nmt(toy_data_bin, tmp_path / "parts", "--max-update", "6", ranks=2)
    assert "resuming from" in resumed.stderr
    assert_same_parameters(
        load_checkpoint(tmp_path / "whole" / "checkpoint_last.pt"),
        load_checkpoint(tmp_path / "parts" / "checkpoint_last.pt"),
        atol=0,
    )


@pytest.mark.slow  # runs three or more processes (10-25 s); make test-all
def test_two_ranks_killed_after_a_checkpoint_resume_and_finish(toy_data_bin, tmp_path):
    import signal
    import time

    cmd = train_cmd(toy_data_bin, tmp_path, "--max-update", "300", "--save-interval-updates", "3", ranks=2)
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=launcher_env(tmp_path)
    )
    for line in proc.stderr:
        if "saved checkpoint_last.pt at update 3" in line:
            # The launcher, and the ranks (torchrun starts them in sessions of their own).
            subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).returncode == 1, "a rank survived"
    assert not (tmp_path / "checkpoint_300.pt").exists()
    killed_at = load_checkpoint(tmp_path / "checkpoint_last.pt")["update"]
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=launcher_env(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at update {killed_at}" in resumed.stderr
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["update"] == 300


FAULTS = str(__import__("pathlib").Path(__file__).with_name("faults.py"))


def our_frames(stderr):
    """Traceback frames from our code (torchrun prints its own traceback when a rank fails; that is not ours)."""
    return [line for line in stderr.splitlines() if line.strip().startswith("File ") and "nmt_cli" in line]


def faulty_run(data_bin, save_dir, fault, *extra, timeout_minutes="30"):
    """2 ranks under torchrun with NMT_TEST_FAULT set (see faults.py)."""
    env = launcher_env(save_dir.parent, NMT_TEST_FAULT=fault, NMT_DIST_TIMEOUT_MINUTES=timeout_minutes)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        FAULTS,
        "train",
        str(data_bin),
        "--save-dir",
        str(save_dir),
        *COMMON,
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow  # torchrun fault handling, 6-10 s a route; make test-all
@pytest.mark.parametrize(
    "fault, message", [("oom:1:3", "rank 1 ran out of memory on a batch"), ("nan:1:3", "non-finite loss")]
)
def test_a_failing_rank_makes_every_rank_skip_the_update(toy_data_bin, tmp_path, fault, message):
    result = faulty_run(toy_data_bin, tmp_path, fault, "--max-update", "5", "--update-freq", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert message in result.stderr
    ckpt = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert ckpt["update"] == 5 and ckpt["train_state"]["n_skipped_updates"] == 1


@pytest.mark.slow  # torchrun fault handling, 6-10 s a route; make test-all
def test_no_ddp_wrapper_outlives_the_process_group(toy_data_bin, tmp_path):
    """Rank teardown: the DDP reducer must not be the process group's last owner (it would join gloo's
    threads holding the GIL, a deadlock at exit in about one run in twenty), so it is gone by then."""
    result = faulty_run(toy_data_bin, tmp_path, "none:0:0", "--max-update", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("ddp wrappers alive at shutdown: 0") == 2, result.stderr[-3000:]


@pytest.mark.slow  # torchrun fault handling, 6-10 s a route; make test-all
def test_out_of_memory_in_the_synchronising_backward_stops_every_rank(toy_data_bin, tmp_path):
    result = faulty_run(toy_data_bin, tmp_path, "oom-backward:1:3", "--max-update", "5")
    assert result.returncode != 0
    assert "error: rank 1 ran out of memory in the backward pass" in result.stderr
    assert "error: rank 0: a collective operation failed (" in result.stderr
    assert not our_frames(result.stderr)


@pytest.mark.slow  # torchrun fault handling, 6-10 s a route; make test-all
def test_a_collective_timeout_names_the_rank(toy_data_bin, tmp_path):
    result = faulty_run(toy_data_bin, tmp_path, "hang:1:3", "--max-update", "5", timeout_minutes="0.05")
    assert result.returncode != 0
    assert "error: rank 0: a collective operation failed (Timed out" in result.stderr, result.stderr[-3000:]
    assert not our_frames(result.stderr)


def test_collective_failure_recognises_gloo_and_nccl_errors_only():
    from nmt_cli.train.distributed import collective_failure

    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:43175: "
        "Connection reset by peer.\nmore"
    )
    assert collective_failure(gloo) == "Read error [127.0.0.1]:43175: Connection reset by peer."
    assert collective_failure(torch.distributed.DistError("NCCL watchdog timeout")) == "NCCL watchdog timeout"
    assert collective_failure(RuntimeError("shape mismatch in our own code")) is None
    assert collective_failure(ValueError("gloo")) is None


def descendants(pid):
    """Every process started, directly or not, by `pid` (torchrun starts its ranks in sessions of their own)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.slow  # runs three or more processes (10-25 s); make test-all
def test_every_rank_resumes_its_own_random_streams(toy_data_bin, tmp_path):
    """With dropout on, 2 ranks killed (SIGKILL) after a checkpoint and resumed end bit-identical to an
    uninterrupted run: each rank saved and restores its own random streams, not rank 0's."""
    import signal

    extra = ["--dropout", "0.3", "--max-update", "12"]
    nmt(toy_data_bin, tmp_path / "whole", *extra, ranks=2)
    cmd = train_cmd(toy_data_bin, tmp_path / "parts", *extra, "--save-interval-updates", "3", ranks=2)
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=launcher_env(tmp_path)
    )
    for line in proc.stderr:
        if "saved checkpoint_last.pt at update 3" in line:
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed_at = load_checkpoint(tmp_path / "parts" / "checkpoint_last.pt")
    assert killed_at["update"] < 12 and len(killed_at["rng"]) == 2
    resumed = nmt(toy_data_bin, tmp_path / "parts", *extra, "--save-interval-updates", "3", ranks=2)
    assert f"at update {killed_at['update']}" in resumed.stderr
    assert_same_parameters(
        load_checkpoint(tmp_path / "whole" / "checkpoint_last.pt"),
        load_checkpoint(tmp_path / "parts" / "checkpoint_last.pt"),
        atol=0,
    )


def test_broadcast_from_main_in_one_process_returns_them_without_a_collective(monkeypatch):
    from nmt_cli.runtime import DistInfo
    from nmt_cli.train import distributed

    def no_collective(*args, **kwargs):
        raise AssertionError("a single process must not call a collective")

    monkeypatch.setattr(distributed.dist, "all_reduce", no_collective)
    # a device this CPU build cannot allocate on: any tensor made there would fail
    for flags in ([], [1.0], [0.0, 2.5], [1.0, 0.0, 3e9]):
        assert distributed.broadcast_from_main(flags, DistInfo(), torch.device("cuda", 7)) == flags


def share_flags_on_rank(rank, store_path, results_dir):
    import torch.distributed as dist

    from nmt_cli.runtime import DistInfo
    from nmt_cli.train.distributed import broadcast_from_main

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    calls = []
    all_reduce = dist.all_reduce
    dist.all_reduce = lambda *args, **kwargs: calls.append(1) or all_reduce(*args, **kwargs)
    try:
        # rank 0's values win, bit for bit: rank 1's in the second place is not seen, rank 0's in the first is
        flags = broadcast_from_main(
            [float(rank == 0), float(rank == 1), 1e3 / 7 + rank, 0.0], DistInfo(rank, 2), torch.device("cpu")
        )
    finally:
        dist.all_reduce = all_reduce
        dist.destroy_process_group()
    torch.save((flags, len(calls)), f"{results_dir}/{rank}.pt")


@ONE_ROUTE  # a collective of four floats: no matrix product
def test_broadcast_from_main_shares_rank_0s_values_in_one_all_reduce(tmp_path):
    import time

    import torch.multiprocessing as mp

    # forked ranks start at once, with torch already imported; each writes what it got to its own file
    ranks = mp.start_processes(
        share_flags_on_rank, args=(str(tmp_path / "store"), tmp_path), nprocs=2, join=False, start_method="fork"
    )
    deadline = time.monotonic() + 60
    try:
        while not ranks.join(timeout=1):  # True once both have ended; it raises where one failed
            assert time.monotonic() < deadline, "the ranks did not finish in 60 s"
    finally:
        for process in ranks.processes:
            process.kill()
    shared = [1.0, 0.0, 1e3 / 7, 0.0]
    results = {rank: torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)}
    assert results == {0: (shared, 1), 1: (shared, 1)}
