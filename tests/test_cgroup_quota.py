"""--threads 0 honours the CPU quota of the process's control group (cgroup v2's cpu.max, v1's cfs files; a
container's --cpus, systemd's CPUQuota=): fake /proc/self/cgroup and /sys/fs/cgroup trees, read by runtime.py,
and a real `nmt serve` that reads them."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nmt_cli import runtime

ROOT = Path(__file__).resolve().parents[1]


def fake_cgroups(tmp_path, proc_lines, files):
    """A /proc/self/cgroup of these lines and a cgroup tree of these {relative path: text} files."""
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("".join(line + "\n" for line in proc_lines))
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return proc, root


CASES = [
    # cgroup v2: a container at the root of its namespace (docker --cpus 2)
    (["0::/"], {"cpu.max": "200000 100000"}, 2.0),
    # v2: a systemd service with CPUQuota=150%, under a slice of 3 CPUs: the lower counts
    (
        ["0::/system.slice/nmt.service"],
        {
            "cpu.max": "max 100000",
            "system.slice/cpu.max": "300000 100000",
            "system.slice/nmt.service/cpu.max": "150000 100000",
        },
        1.5,
    ),
    # v2: the slice's quota is the lower one
    (
        ["0::/system.slice/nmt.service"],
        {"system.slice/cpu.max": "50000 100000", "system.slice/nmt.service/cpu.max": "max 100000"},
        0.5,
    ),
    # v2 without a quota
    (["0::/user.slice"], {"user.slice/cpu.max": "max 100000"}, None),
    # v1: the cpu controller's hierarchy; the group seen from the host is absent in the container's mount
    (
        ["4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc"],
        {"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"},
        3.0,
    ),
    # v1 without a quota
    (["3:cpu,cpuacct:/"], {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
]


@pytest.mark.parametrize(("proc_lines", "files", "cpus"), CASES)
def test_the_quota_is_read_from_v1_and_v2_files(tmp_path, monkeypatch, proc_lines, files, cpus):
    monkeypatch.setattr(runtime, "PROC_CGROUP", (paths := fake_cgroups(tmp_path, proc_lines, files))[0])
    monkeypatch.setattr(runtime, "CGROUP_ROOT", paths[1])
    assert runtime.cgroup_cpus() == cpus


@pytest.mark.parametrize(
    ("quota", "affinity", "cores"),
    [("150000 100000", 8, 2), ("50000 100000", 8, 1), ("800000 100000", 2, 2), ("max 100000", 4, 4)],
)
def test_usable_cores_is_the_affinity_at_most_the_quota_rounded_up(tmp_path, monkeypatch, quota, affinity, cores):
    proc, root = fake_cgroups(tmp_path, ["0::/"], {"cpu.max": quota})
    monkeypatch.setattr(runtime, "PROC_CGROUP", proc)
    monkeypatch.setattr(runtime, "CGROUP_ROOT", root)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    assert runtime.usable_cores() == cores


def test_no_cgroup_files_leave_the_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "PROC_CGROUP", tmp_path / "absent")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert runtime.cgroup_cpus() is None and runtime.usable_cores() == 3


def test_a_real_server_with_threads_0_searches_with_the_quota(tmp_path, tiny_checkpoint):
    pytest.importorskip("uvicorn")
    proc_file, root = fake_cgroups(tmp_path, ["0::/"], {"cpu.max": "100000 100000"})  # 1 CPU
    start = (
        f"import sys; from nmt_cli import runtime; runtime.PROC_CGROUP = runtime.Path({str(proc_file)!r}); "
        f"runtime.CGROUP_ROOT = runtime.Path({str(root)!r}); from nmt_cli.__main__ import main; "
        "sys.argv[0] = 'nmt'; main()"
    )
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-c", start, "serve", "--path", str(tiny_checkpoint), "--port", "0", "--device", "cpu"],
            cwd=ROOT,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 60
        while "searching with" not in log.read_text() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.kill()
        server.wait()
    said = log.read_text()
    assert re.search(r"searching with 1 CPU thread\(s\) \(--threads 0: the 1 core\(s\)", said), said
