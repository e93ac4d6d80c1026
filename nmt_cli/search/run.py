"""`nmt generate` end to end: resolve settings, load the checkpoint, pick the input, write, summarise."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from nmt_cli.checkpoint import search_config_of
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.runtime import choose_device, resolve_precision, set_threads
from nmt_cli.search.generate import Summary, generate_split, generate_text, load_translator, shard_range

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateRequest:
    checkpoint: Path
    data_dir: Path | None = None
    input_path: str | None = None
    gen_subset: str = "test"
    buffer_size: int = 1000
    output_format: str | None = None
    results_path: Path | None = None
    max_tokens: int = 8000
    batch_size: int = 0
    search_overrides: dict[str, Any] | None = None
    device: str = "auto"
    threads: int = 0
    bf16: bool = False
    fp16: bool = False
    num_shards: int = 1
    shard_id: int = 0


def resolve_shard(req: GenerateRequest) -> tuple[int, int]:
    """--num-shards/--shard-id, or the torchrun rank and world size when those are not given."""
    num, shard = req.num_shards, req.shard_id
    if num == 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        num, shard = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
    if shard >= num:
        raise ConfigError(f"--shard-id {shard} must be below --num-shards {num}")
    return num, shard


def run_generate(req: GenerateRequest) -> Summary:
    if (req.data_dir is None) == (req.input_path is None):
        raise ConfigError("give either DATA_DIR (with --gen-subset) or --input FILE|-, not both or neither")
    num_shards, shard_id = resolve_shard(req)
    if req.input_path == "-" and num_shards > 1:
        raise ConfigError("--num-shards needs --input FILE or DATA_DIR; stdin cannot be split")
    if req.input_path not in (None, "-") and not Path(req.input_path).is_file():
        raise DataError(f"--input {req.input_path} does not exist")
    set_threads(req.threads)
    device = choose_device(req.device, int(os.environ.get("LOCAL_RANK", "0")))
    amp = resolve_precision(device, req.bf16, req.fp16) if (req.bf16 or req.fp16) else None
    translator, state = load_translator(req.checkpoint, device, amp)
    given = {k: v for k, v in (req.search_overrides or {}).items() if v is not None}
    cfg = replace(search_config_of(state), **given)
    if state.get("target_format", "text") == "ptb-tree":  # a parser writes trees (nmt_cli/parsing/generate.py)
        from nmt_cli.parsing.generate import run_parse

        return run_parse(req, translator, cfg, num_shards, shard_id)
    fmt = req.output_format or ("fairseq" if req.data_dir else "plain")
    with ExitStack() as stack:
        out = open_output(req, stack, num_shards, shard_id)
        if req.data_dir is not None:
            summary = generate_split(translator, req.data_dir, req.gen_subset, cfg, req.max_tokens, req.batch_size,
                                     fmt, out, (num_shards, shard_id))
        else:
            lines = open_input(req.input_path, stack, num_shards, shard_id)
            summary = generate_text(translator, lines, cfg, req.max_tokens, req.batch_size, fmt, out,
                                    req.buffer_size)
    logger.info("translated %d sentences (%d tokens) in %.1f s: %.1f sentences/s, %.0f tokens/s "
                "(beam %d, lenpen %g %s)", summary.n_sentences, summary.n_tokens, summary.seconds,
                summary.n_sentences / max(summary.seconds, 1e-9), summary.n_tokens / max(summary.seconds, 1e-9),
                cfg.beam, cfg.lenpen, cfg.lenpen_style)
    return summary


def open_output(req: GenerateRequest, stack: ExitStack, num_shards: int, shard_id: int) -> TextIO:
    if req.results_path is None:
        return sys.stdout
    try:
        req.results_path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create --results-path {req.results_path}: {e.strerror}") from None
    name = f"generate-{req.gen_subset if req.data_dir else 'input'}"
    name += f".shard{shard_id}-of-{num_shards}.txt" if num_shards > 1 else ".txt"
    return stack.enter_context((req.results_path / name).open("w", encoding="utf-8"))


def open_input(path: str | None, stack: ExitStack, num_shards: int, shard_id: int) -> list[str] | TextIO:
    if path == "-":
        return sys.stdin
    assert path is not None
    stream = stack.enter_context(Path(path).open(encoding="utf-8", errors="strict"))
    if num_shards == 1:
        return stream
    lines = stream.readlines()
    return [lines[i] for i in shard_range(len(lines), num_shards, shard_id)]
