"""The deployment files of deploy/: the systemd unit verified by systemd-analyze (else its keys read), the image
definitions linted by hadolint where it is installed and read for what they must hold, the config file served by
a real `nmt serve`, and the CPU image built and run where a Docker daemon answers (slow)."""

import configparser
import http.client
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
NMT = Path(sys.executable).parent / "nmt"


def unit_with_this_nmt(tmp_path):
    """The unit, its ExecStart pointed at this environment's nmt (systemd-analyze checks that it exists)."""
    unit = tmp_path / "nmt-serve.service"
    text = (DEPLOY / "nmt-serve.service").read_text()
    unit.write_text(text.replace("/opt/nmt/venv/bin/nmt", str(NMT)))
    return unit


def test_the_unit_verifies(tmp_path):
    unit = unit_with_this_nmt(tmp_path)
    if shutil.which("systemd-analyze"):
        checked = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr  # unknown keys only warn
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(unit)
    service = parser["Service"]
    assert service["ExecStart"].split()[1:] == ["serve", "--config", "/etc/nmt/serve.toml"]
    assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) > 30  # above --drain-timeout's 30
    assert "CPUQuota" in service and parser["Install"]["WantedBy"] == "multi-user.target"


def instructions(dockerfile):
    """A Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(line for line in dockerfile.read_text().splitlines() if line[:1] != "#"))
    return [(line.split()[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_the_image_definitions_lint_and_hold_what_they_must(name):
    dockerfile = DEPLOY / name
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(NMT.parent))
    if hadolint:
        linted = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
        assert linted.returncode == 0, linted.stdout + linted.stderr
    steps = instructions(dockerfile)
    runs = " ".join(args for key, args in steps if key == "RUN")
    assert 'pip install --no-cache-dir ".[serve]"' in runs
    if name == "Dockerfile":
        assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in runs
    else:
        assert re.search(r"BASE=pytorch/pytorch:2\.13\.0-cuda[\d.]+-cudnn\d+-runtime", dict(steps)["ARG"])
    assert dict(steps)["USER"].isdigit()  # not root; numeric, so that a runtime can check it
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["nmt", "serve"]
    assert "/health" in dict(steps)["HEALTHCHECK"]
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for key, args in steps:  # every file copied exists and the build context keeps it
        for source in args.split()[:-1] if key == "COPY" else ():
            assert (ROOT / source).exists() and f"!{source.rstrip('/')}" in ignored, source


def get(port, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    return response.status, response.read()


def wait_ready(port, timeout):
    """Poll /ready until it answers 200 (the socket may not listen yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if get(port, "/ready")[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the server did not get ready"
        time.sleep(0.1)


def test_the_config_file_serves(tmp_path, tiny_checkpoint, monkeypatch):
    """deploy/nmt-serve.toml as written, its model, key and port overridden from the environment and the command
    line, as an operator trying it would."""
    pytest.importorskip("uvicorn")
    key = tmp_path / "api-key"
    key.write_text("s3cret\n")
    env = {"NMT_SERVE_PATH": f"digits={tiny_checkpoint}", "NMT_SERVE_API_KEY_FILE": str(key), "NMT_SERVE_THREADS": "1"}
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "nmt_cli", "serve", "--config", DEPLOY / "nmt-serve.toml", "--port", "0"],
            cwd=ROOT,
            env={**__import__("os").environ, **env},
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 90
        while not (found := re.search(r"on http://127\.0\.0\.1:(\d+)", log.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        port = int(found.group(1))
        wait_ready(port, 60)
        assert get(port, "/info")[0] == 401  # the key file of the environment guards the API
        status, body = get(port, "/info", {"Authorization": "Bearer s3cret"})
        assert status == 200 and b"digits" in body
    finally:
        server.kill()
        server.wait()


def docker_answers():
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not docker_answers(), reason="no Docker daemon answers here")
def test_the_cpu_image_builds_and_serves(tiny_checkpoint):
    subprocess.run(["docker", "build", "-f", "deploy/Dockerfile", "-t", "nmt-serve:test", "."], cwd=ROOT, check=True)
    run = ["docker", "run", "-d", "--rm", "-p", "127.0.0.1::8080", "--cpus", "1"]
    run += ["-v", f"{tiny_checkpoint}:/models/model.pt:ro", "-e", "NMT_SERVE_PATH=/models/model.pt", "nmt-serve:test"]
    container = subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()
    try:
        port = int(
            subprocess.run(["docker", "port", container, "8080"], capture_output=True, text=True).stdout.split(":")[-1]
        )
        wait_ready(port, 120)
        logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True).stderr
        assert "searching with 1 CPU thread(s)" in logs  # --cpus 1: the cgroup's quota
    finally:
        subprocess.run(["docker", "stop", container], capture_output=True)
