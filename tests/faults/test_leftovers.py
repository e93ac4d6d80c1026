"""What SIGKILL leaves in a directory that several runs write into (generate's --results-path, the directory of
average-checkpoints' --output) is removed by the next run that writes there, whatever its output's name; a
temporary that a live process is writing, and files that are not our temporaries, are left alone."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import nmt

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# A live writer: our atomic writer holds `sys.argv[1]`'s temporary open until this process's stdin closes.
HOLD = """
import sys
from pathlib import Path
from nmt_cli.files import atomic_text_output
with atomic_text_output(Path(sys.argv[1])) as f:
    f.write("partial")
    f.flush()
    print("writing", flush=True)
    sys.stdin.read()
"""

# average-checkpoints killed by SIGKILL inside torch.save, after its first write into the temporary
KILLED_IN_TORCH_SAVE = """
import os, signal, sys
import torch
real_save = torch.save
class Killing:
    def __init__(self, f): self.f = f
    def write(self, data):
        n = self.f.write(data)
        self.f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        return n
    def flush(self): self.f.flush()
torch.save = lambda obj, f, *a, **k: real_save(obj, Killing(f), *a, **k)
from nmt_cli.cli import main
sys.argv[0] = "nmt"
main()
"""


def wait_for(tmp: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not tmp.exists():
        assert process.poll() is None, process.stderr.read() if process.stderr else process.returncode
        assert time.monotonic() < deadline, f"{tmp} was never written"
        time.sleep(0.05)


def hold(path: Path) -> subprocess.Popen:
    """A live process writing `path` through its temporary, until its stdin is closed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert process.stdout is not None and process.stdout.readline() == "writing\n"
    return process


def release(process: subprocess.Popen) -> None:
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(timeout=60) == 0


def test_generate_removes_a_killed_generates_temporary_whatever_its_input(tiny_checkpoint, tmp_path):
    results = tmp_path / "results"
    killed = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "--no-progress", "generate", "--path", str(tiny_checkpoint), "--input", "-"]
        + ["--results-path", str(results)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    try:
        assert killed.stdin is not None
        killed.stdin.write(b"1 2 3\n")
        killed.stdin.flush()  # stdin stays open: the run is translating into its temporary
        wait_for(results / "generate-stdin.txt.tmp", killed)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    assert (results / "generate-stdin.txt.tmp").exists(), "SIGKILL leaves the temporary"
    (results / "notes.txt.tmp").write_text("a user's file")  # not one of generate's names
    live = hold(results / "generate-live.txt")
    try:
        source = tmp_path / "other.txt"
        source.write_text("4 5 6\n")
        r = nmt("generate", "--path", tiny_checkpoint, "--input", source, "--results-path", results)
        assert r.exit_code == 0, r.output
        assert "generate-stdin.txt.tmp" in r.output, "the removal is logged"
        names = sorted(p.name for p in results.iterdir())
        assert names == ["generate-live.txt.tmp", "generate-other.txt.txt", "notes.txt.tmp"], names
    finally:
        release(live)
    assert (results / "generate-live.txt").read_text() == "partial", "the live writer finished unharmed"


def test_average_removes_a_killed_averages_temporary_whatever_its_output(tiny_checkpoint, tmp_path):
    run = tiny_checkpoint.parent
    inputs = ["--inputs", run / "checkpoint_4.pt", run / "checkpoint_6.pt"]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_IN_TORCH_SAVE, "average-checkpoints", *map(str, inputs)]
        + ["--output", str(tmp_path / "first.pt")],
        capture_output=True,
        env=ENV,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (tmp_path / "first.pt.tmp").exists(), "SIGKILL leaves the temporary"
    (tmp_path / "data.tmp").write_text("a user's file")  # not a checkpoint's temporary
    (tmp_path / "link.pt.tmp").symlink_to(tiny_checkpoint)  # a link is never ours
    live = hold(tmp_path / "live.pt")
    try:
        r = nmt("average-checkpoints", *inputs, "--output", tmp_path / "second.pt")
        assert r.exit_code == 0, r.output
        assert "first.pt.tmp" in r.output
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["data.tmp", "link.pt.tmp", "live.pt.tmp", "second.pt"], names
    finally:
        release(live)
    assert tiny_checkpoint.exists()


@pytest.mark.parametrize("held", [False, True])
def test_only_temporaries_nobody_holds_are_removed(tmp_path, held):
    """In-process: the lock of our writer, not the process, decides (a second open of the file is another holder)."""
    from nmt_cli.files import open_held, remove_abandoned_temporaries

    tmp = tmp_path / "a.pt.tmp"
    tmp.write_bytes(b"PK")
    f = open_held(tmp, "wb") if held else None
    try:
        removed = remove_abandoned_temporaries(tmp_path, ("*.pt.tmp",))
    finally:
        if f is not None:
            f.close()
    assert tmp.exists() == held
    assert removed == ([] if held else [tmp])
