"""What `nmt serve` translates with: a checkpoint (or an ensemble's) opened as `nmt generate` opens it, the
settings every request starts from and the caps on them, and the model's jobs: reading a request (request.py),
/info (info.py), and the batcher worker's search of a batch (batch_search.py).
"""

from __future__ import annotations

from typing import Any

from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError
from nmt_cli.search.translate import open_for_inference
from nmt_cli.serve.batch_search import BatchSearch
from nmt_cli.serve.caps import Caps, cap_problem
from nmt_cli.serve.info import model_info
from nmt_cli.serve.request import RequestReader
from nmt_cli.steps import run_to_end


class ServedModel:
    """A loaded checkpoint, the settings every request starts from, how it reads requests and searches batches.

    Raises ConfigError (or CheckpointError) for a checkpoint that cannot be served with `cfg`."""

    def __init__(self, cfg: ServeConfig, search_overrides: dict[str, Any]) -> None:
        self.path = cfg.path
        inference = open_for_inference(cfg, search_overrides)  # the checkpoint read as generate reads it
        saved = inference.saved
        self.device, self.precision, self.search = inference.device, inference.precision, inference.search
        self.max_tokens = cfg.max_batch_tokens
        self.caps = Caps.of(cfg, self.search, inference.max_positions)
        if problem := cap_problem(self.search, self.caps, flag=True):  # the CLI's words, at start
            raise ConfigError(f"{problem}; raise the limit or lower the setting")
        self.info = model_info(inference, cfg, self.caps)
        self.reader = RequestReader(
            cfg.path, self.search, inference.bounds, self.caps, saved.vocab, inference.max_positions, saved.is_parser
        )
        self.searcher = BatchSearch(inference, max_tokens=cfg.max_batch_tokens)

    def warm_up(self) -> None:
        """Build the model in the worker thread, then run one sentence through it, so that the first request
        does not pay for first-call set-up."""
        run_to_end(self.searcher.run(self.search, self.reader.prepare(["Hello, world."])))
