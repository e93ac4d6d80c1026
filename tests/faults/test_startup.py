"""Start-up: `--help` and argument errors load no torch, a bad NMT_CPU_MATMUL or NMT_CPU_INT8 is one error line, and Ctrl-C at any
moment of a command (its imports included) is one `error: interrupted` line and exit 130, never a traceback: from the
first line of nmt_cli/__main__.py, which `python -m nmt_cli` and the `nmt` script both run first."""

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt_cli.cli import cli

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HEAVY = ("torch", "numpy")


def run_python(code: str, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_help_of_the_nmt_command_imports_no_torch():
    """`python -m nmt_cli train --help`, as a user runs it: no torch or numpy among the modules it imported."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "nmt_cli", "train", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: nmt train" in result.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert "nmt_cli.cli" in imported
    assert not [m for m in imported if m.split(".")[0] in HEAVY]


def test_the_installed_nmt_script_starts_the_command_line():
    """The `nmt` script that installing the package puts beside this python (setup.cfg's entry point): the tests
    run the command in-process or as `python -m nmt_cli`, so this is where the script a user types is run."""
    script = Path(sys.executable).with_name("nmt")
    assert script.is_file(), f"{script} is missing: install the package (make install)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("nmt, version "), version.stderr
    usage = subprocess.run([str(script), "score"], capture_output=True, text=True, env=env, timeout=120)
    assert usage.returncode == 2 and "Usage: nmt score" in usage.stderr and "Traceback" not in usage.stderr


def test_every_help_and_usage_error_imports_no_torch():
    """Each subcommand's --help, and a usage error, in one process: torch and numpy are never imported."""
    code = """
import sys
import click
from nmt_cli.cli import cli

names = [[name] for name in cli.commands] + [["plot", name] for name in cli.commands["plot"].commands]
for words in [[], *names]:
    try:
        cli.main([*words, "--help"], prog_name="nmt", standalone_mode=False)
    except click.exceptions.Exit:
        pass
for words in (["train", "--no-such-option"], ["generate", "--beam", "x"], ["score"]):
    try:
        cli.main(words, prog_name="nmt", standalone_mode=False)
        raise SystemExit(f"{words}: no usage error")
    except click.UsageError:
        pass
print(len(names), sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    count, heavy = result.stdout.splitlines()[-1].split(maxsplit=1)  # after the help texts
    assert heavy == "[]", result.stdout
    assert int(count) >= 9  # 8 subcommands and plot's two


def test_every_command_has_its_commands_module():
    """start_command imports commands/X.py for cli/X.py while Ctrl-C still quits at once: each must exist."""
    commands = [c for c in cli.commands.values() if c.name != "plot"] + list(cli.commands["plot"].commands.values())
    for command in commands:
        module = command.callback.__wrapped__.__module__.replace("nmt_cli.cli.", "nmt_cli.commands.")
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module


@pytest.mark.parametrize(
    "variable, choices", [("NMT_CPU_MATMUL", "auto, onednn, default"), ("NMT_CPU_INT8", "auto, fbgemm, onednn")]
)
def test_a_bad_cpu_route_is_one_error_line_and_help_still_answers(tmp_path, monkeypatch, variable, choices):
    text = tmp_path / "hyp.txt"
    text.write_text("a b c\n")
    monkeypatch.setenv(variable, "fastest")
    result = CliRunner().invoke(cli, ["score", "--sys", str(text), "--ref", str(text)])
    assert result.exit_code == 1
    assert ANSI.sub("", result.output).strip() == f"error: {variable}='fastest': expected one of {choices}"
    assert CliRunner().invoke(cli, ["score", "--help"]).exit_code == 0


def interrupt(fifo: Path, delay: float | None) -> subprocess.CompletedProcess:
    """`nmt score` whose hypotheses are a FIFO nobody writes, so that the command never ends by itself; SIGINT
    `delay` seconds after the command line is imported (Ctrl-C works from there on: nmt_cli/__main__.py), or,
    with delay None, once the command is reading its input (its work)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-X", "importtime", "-m", "nmt_cli", "score", "--sys", str(fifo), "--ref", str(fifo)]
    # As from a terminal, where Ctrl-C is not ignored: a shell starts a background job (`make test &`) ignoring
    # SIGINT, and a process started ignoring it keeps ignoring it (Python then sets no handler of its own), so the
    # child is started while this process handles SIGINT, which exec resets to the default.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, handler)
    err: list[str] = []
    imported = threading.Event()

    def read_stderr() -> None:  # all of it, as it comes: -X importtime writes a line per module imported
        assert process.stderr is not None
        for line in process.stderr:
            err.append(line)
            if line.rstrip().endswith("| nmt_cli.cli"):
                imported.set()
        imported.set()

    reader = threading.Thread(target=read_stderr)
    reader.start()
    try:
        assert imported.wait(60)
        if delay is None:
            deadline = time.monotonic() + 60
            while True:  # a FIFO opens for writing without blocking once its reader has it open
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                    break
                except OSError as e:
                    assert e.errno == errno.ENXIO and time.monotonic() < deadline, e
                    assert process.poll() is None, "".join(err)
                    time.sleep(0.02)
        else:
            time.sleep(delay)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        assert process.stdout is not None
        out = process.stdout.read()  # not communicate(): it would read stderr too, beside read_stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join()
    return subprocess.CompletedProcess(cmd, process.returncode, out, "".join(err))


@pytest.mark.parametrize("delay", [0.0, 0.15, 0.5, None], ids=["at-once", "early-import", "torch-import", "working"])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(tmp_path, delay):
    fifo = tmp_path / "hyp.fifo"
    os.mkfifo(fifo)
    result = interrupt(fifo, delay)
    err = ANSI.sub("", result.stderr)
    assert "Traceback" not in err, err
    messages = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert messages == ["error: interrupted"], err
    assert result.returncode == 130, err


def interrupted_at(command: list[str], delay: float) -> subprocess.CompletedProcess:
    """`command` sent SIGINT `delay` seconds after it was started (as from a terminal: see `interrupt`)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, handler)
    try:
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def before_nmt(result: subprocess.CompletedProcess) -> bool:
    """Whether the signal came while the interpreter itself was starting, before any of nmt's code ran: killed before
    Python set its handler, or a KeyboardInterrupt with no frame of nmt_cli/ (in site's .pth files, an editable
    install's finder, runpy, the import of nmt_cli/__main__.py)."""
    if not result.stderr.strip():
        return result.returncode == -signal.SIGINT  # also the status of a KeyboardInterrupt's traceback
    interpreters = "Traceback" in result.stderr or "Fatal Python error" in result.stderr
    return interpreters and not re.search(r'File "[^"]*/nmt_cli/', result.stderr)


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2])
@pytest.mark.parametrize("entry", ["python -m nmt_cli", "nmt"])
def test_ctrl_c_soon_after_the_start_is_one_line_and_exit_130(tmp_path, entry, delay):
    """SIGINT 0.05, 0.1 and 0.2 s after `generate` starts (its checkpoint and input FIFOs nobody writes, so that it
    never ends by itself). A try whose signal came before any of nmt's code ran is the interpreter's (a busy machine
    starts it slowly) and is tried again; every other one must end in the one line."""
    fifo = tmp_path / "never.fifo"
    os.mkfifo(fifo)
    start = [sys.executable, "-m", "nmt_cli"] if entry != "nmt" else [str(Path(sys.executable).with_name("nmt"))]
    command = [*start, "generate", "--path", str(fifo), "--input", str(fifo), "--device", "cpu"]
    for _ in range(5):
        result = interrupted_at(command, delay)
        if not before_nmt(result):
            break
    else:
        first = result.stderr.strip().splitlines()[:1]
        pytest.skip(f"the interpreter had not reached nmt's code {delay} s after its start in 5 tries: {first}")
    err = ANSI.sub("", result.stderr)
    assert "Traceback" not in err and err.splitlines() == ["error: interrupted"], err
    assert result.returncode == 130, err


def test_ctrl_c_while_nmts_entry_imports_is_one_line_and_exit_130(tmp_path):
    """SIGINT at the first moment nmt's code runs: while nmt_cli/__main__.py imports nmt_cli.errors, its first import
    (the process signals itself from an import hook, as `python -m nmt_cli score` on FIFOs nobody writes starts).
    SIGINT is held from __main__.py's first line until its handler is set; it had been a KeyboardInterrupt
    traceback."""
    fifo = tmp_path / "hyp.fifo"
    os.mkfifo(fifo)
    code = f"""
import os, runpy, signal, sys

class SignalOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "nmt_cli.errors":
            os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, SignalOnImport())
sys.argv = ["nmt", "score", "--sys", {str(fifo)!r}, "--ref", {str(fifo)!r}]
runpy.run_module("nmt_cli", run_name="__main__", alter_sys=True)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see `interrupt`)
    try:
        process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, handler)
    try:
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "Traceback" not in err and err.splitlines() == ["error: interrupted"], err
    assert process.returncode == 130, err
