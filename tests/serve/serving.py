"""An in-process `nmt serve` app (Starlette's TestClient runs its lifespan, so the worker thread too)."""

import json
import time
import warnings
from contextlib import contextmanager

from click.testing import CliRunner

from nmt_cli.cli import cli
from nmt_cli.config import ServeConfig

# Digit sentences like the copy corpus the fixtures' models learned (tests/conftest.py)
SENTENCES = ["1 2 3", "4 5 6 7 8 9", "0", "9 9 8", "3 1 4 1 5 9 2 6", "7 7", "5 0 5 0 5", "2 4 6 8"]


@contextmanager
def serving(
    ckpt, *, max_wait=0.01, max_queue=256, timeout=30.0, max_request_sentences=64, search=None, limits=None, **serve
):
    """A TestClient of the app `nmt serve --path ckpt` builds, once /ready says the model is warm; `limits`: more
    of Limits' fields (max_body_bytes, api_key, cors_origins)."""
    with warnings.catch_warnings():  # starlette 1.x prefers httpx2 and warns about httpx, which works
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from starlette.testclient import TestClient

    from nmt_cli.serve.app import Limits, make_app
    from nmt_cli.serve.models import Models

    cfg = ServeConfig(path=str(ckpt), device="cpu", threads=1, **serve)  # more_paths=(...): several models
    models = Models.open(cfg, search or {})
    app = make_app(models, max_wait, max_queue, Limits(max_request_sentences, timeout, **(limits or {})))
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.01)
        yield client


def generate_jsonl(ckpt, tmp_path, lines, *extra):
    """`nmt generate --output-format jsonl` of these lines: one record per line."""
    src = tmp_path / "input.txt"
    src.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(
        cli,
        ["generate", "--path", str(ckpt), "--input", str(src), "--device", "cpu", "--threads", "1"]
        + ["--output-format", "jsonl", *extra],
    )
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def relabeled(ckpt, dest, source_lang, target_lang):
    """A copy of a checkpoint that names other languages: a second model for a server of several."""
    from nmt_cli.checkpoint import load_checkpoint, save_checkpoint

    saved = load_checkpoint(ckpt)
    saved["source_lang"], saved["target_lang"] = source_lang, target_lang
    save_checkpoint(saved, dest)
    return dest
