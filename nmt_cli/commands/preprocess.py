"""`nmt preprocess`: train a joint sentencepiece model and binarize the splits, of text (data/preprocess.py) or of
trees (parsing/preprocess.py); returns the summary the cli prints."""

from __future__ import annotations

import json

from nmt_cli.config import PreprocessConfig, parses_trees
from nmt_cli.data.preprocess import preprocess as preprocess_data
from nmt_cli.parsing.preprocess import preprocess_trees


def preprocess(cfg: PreprocessConfig) -> str:
    """Write cfg's data directory; one JSON line: languages, vocabulary size, splits."""
    meta = preprocess_trees(cfg) if parses_trees(cfg.target_format) else preprocess_data(cfg)
    return json.dumps({k: meta[k] for k in ("source_lang", "target_lang", "vocab_size", "splits")})
