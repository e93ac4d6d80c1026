"""A parallel dataset over the memory-mapped arrays that `nmt preprocess` wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nmt_cli.data.binarize import TokenArray
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import DataError

META_FILE = "meta.json"  # the data directory layout, written by preprocess.py
SPM_FILE = "spm.model"


def load_meta(data_dir: Path) -> dict[str, Any]:
    meta_path = data_dir / META_FILE
    if not data_dir.is_dir():
        raise DataError(f"data directory {data_dir} does not exist; create it with \"nmt preprocess\"")
    if not meta_path.is_file():
        raise DataError(f"{data_dir} is not an nmt data directory (no {META_FILE}); "
                        "create it with \"nmt preprocess\"")
    try:
        return json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{meta_path} is not valid JSON ({e})") from None


def load_vocab(data_dir: Path) -> Vocab:
    return Vocab.load(data_dir / SPM_FILE)


class ParallelDataset:
    """Pairs of token-id arrays (no EOS) for one split; lengths are exposed for batching."""

    def __init__(self, data_dir: Path, split: str) -> None:
        meta = load_meta(data_dir)
        if split not in meta["splits"]:
            raise DataError(f"{data_dir} has no split {split!r}; it has {', '.join(meta['splits'])}")
        self.split = split
        self.src = TokenArray(data_dir / f"{split}.{meta['source_lang']}")
        self.tgt = TokenArray(data_dir / f"{split}.{meta['target_lang']}")
        if len(self.src) != len(self.tgt):
            raise DataError(f"{data_dir}: split {split} has {len(self.src)} source and {len(self.tgt)} "
                            "target sentences; re-run \"nmt preprocess\"")

    @property
    def src_lens(self) -> np.ndarray:
        return self.src.lengths

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.tgt.lengths

    def __len__(self) -> int:
        return len(self.src)
