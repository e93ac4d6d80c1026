"""Files read beside the input through pipes: `nmt generate --input`, `--prefix-file` and `--constraints-file`, and
`nmt score-pairs --source` and `--target`, as FIFOs and as a shell's process substitution (`<(...)`), each read
once, a line of each with each input line: they translate (and score) as regular files of the same lines do, and a
file that ends before another is named at its line. They had been counted to the end and then opened again, so
that a FIFO waited for ever and a `<(...)` read as empty."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import nmt

ROOT = Path(__file__).resolve().parents[2]
SOURCES = "1 2 3\n4 5\n6 7 8 9\n"
PREFIXES = "7\n\n3 3\n"
CONSTRAINTS = "9\n8\t5\n\n"


def run(*cmd: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=120)


def in_bash(words: list[str | Path], texts: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -m nmt_cli WORDS` run by bash, where a word `<(NAME)` is a process substitution printing texts[NAME]."""
    line = " ".join(f'<(printf %s "${w[2:-1]}")' if str(w).startswith("<(") else f"'{w}'" for w in words)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **texts}
    command = ["bash", "-c", f"exec '{sys.executable}' -m nmt_cli {line}"]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def feed(fifo: Path, text: str) -> threading.Thread:
    """A thread that writes `text` into `fifo` once a reader has opened it (giving up after a minute)."""

    def write() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
            except OSError:
                time.sleep(0.01)
                continue
            os.set_blocking(fd, True)
            try:
                os.write(fd, text.encode())
            except BrokenPipeError:
                pass
            finally:
                os.close(fd)
            return

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def generate_words(ckpt: Path, source: object, prefixes: object, constraints: object) -> list:
    return ["generate", "--path", ckpt, "--device", "cpu", "--threads", 1, "--beam", 3, "--input", source,
            "--prefix-file", prefixes, "--constraints-file", constraints]  # fmt: skip


def from_files(ckpt: Path, tmp_path: Path) -> str:
    files = []
    for name, text in (("src", SOURCES), ("prefix", PREFIXES), ("constraints", CONSTRAINTS)):
        files.append(tmp_path / f"{name}.txt")
        files[-1].write_text(text)
    r = nmt(*generate_words(ckpt, *files))
    assert r.exit_code == 0, r.output
    assert r.stdout.count("\n") == 3 and r.stdout.startswith("7")
    return r.stdout


def test_generate_reads_fifos_as_files(tiny_checkpoint, tmp_path):
    fifos = [tmp_path / f"{name}.fifo" for name in ("src", "prefix", "constraints")]
    writers = []
    for fifo, text in zip(fifos, (SOURCES, PREFIXES, CONSTRAINTS)):
        os.mkfifo(fifo)
        writers.append(feed(fifo, text))
    r = run(sys.executable, "-m", "nmt_cli", *generate_words(tiny_checkpoint, *fifos))
    assert r.returncode == 0, r.stderr
    assert r.stdout == from_files(tiny_checkpoint, tmp_path)
    for writer in writers:
        writer.join(timeout=10)
        assert not writer.is_alive()


def test_generate_reads_process_substitutions_as_files(tiny_checkpoint, tmp_path):
    texts = {"SRC": SOURCES, "PREFIX": PREFIXES, "CONSTRAINTS": CONSTRAINTS}
    r = in_bash(generate_words(tiny_checkpoint, "<(SRC)", "<(PREFIX)", "<(CONSTRAINTS)"), texts)
    assert r.returncode == 0, r.stderr
    assert r.stdout == from_files(tiny_checkpoint, tmp_path)


def test_a_pipe_that_ends_first_is_named_at_its_line(tiny_checkpoint):
    """A prefix file of 2 lines beside an input of 3: the error names both files and the input's line 3."""
    words = ["generate", "--path", tiny_checkpoint, "--device", "cpu", "--input", "<(SRC)", "--prefix-file", "<(P)"]
    r = in_bash(words, {"SRC": SOURCES, "P": "7\n\n"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --prefix-file /dev/fd/") and " ends before line 3 of --input /dev/fd/" in error
    assert error.endswith("; give one prefix line (an empty one for none) per input line"), error
    assert r.stdout == ""  # found before the chunk's first line was translated


def test_score_pairs_reads_process_substitutions_as_files(tiny_checkpoint, tmp_path):
    source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
    source.write_text(SOURCES)
    target.write_text(SOURCES)
    expected = nmt("score-pairs", "--path", tiny_checkpoint, "--source", source, "--target", target)
    assert expected.exit_code == 0 and expected.stdout.count("\n") == 3, expected.output
    words = ["score-pairs", "--path", tiny_checkpoint, "--threads", 1, "--source", "<(SRC)", "--target", "<(TGT)"]
    r = in_bash(words, {"SRC": SOURCES, "TGT": SOURCES})
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected.stdout
    r = in_bash(words, {"SRC": SOURCES, "TGT": "1 2 3\n4 5\n6 7 8 9\n0\n"})
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert " ends before line 4 of --target /dev/fd/" in r.stderr.strip().splitlines()[-1], r.stderr
