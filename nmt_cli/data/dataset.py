"""A parallel dataset over the memory-mapped arrays that `nmt preprocess` wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nmt_cli import __version__
from nmt_cli.data.binarize import TokenArray
from nmt_cli.data.vocab import Vocab
from nmt_cli.errors import DataError

META_FILE = "meta.json"  # the data directory layout, written by preprocess.py
SPM_FILE = "spm.model"
# meta.json's own format. 1: records the sentencepiece model's sha256 and a checksum of every offsets file.
META_FORMAT_VERSION = 1
META_KEYS = ("source_lang", "target_lang", "vocab_size", "splits")


def load_meta(data_dir: Path) -> dict[str, Any]:
    meta_path = data_dir / META_FILE
    if not data_dir.is_dir():
        raise DataError(f'data directory {data_dir} does not exist; create it with "nmt preprocess"')
    if not meta_path.is_file():
        raise DataError(f'{data_dir} is not an nmt data directory (no {META_FILE}); create it with "nmt preprocess"')
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{meta_path} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or any(k not in meta for k in META_KEYS):
        raise DataError(
            f'{meta_path} is not an nmt data description (it needs {", ".join(META_KEYS)}); re-run "nmt preprocess"'
        )
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or version > META_FORMAT_VERSION:
        raise DataError(
            f"{meta_path} has format version {version!r} (written by nmt "
            f"{meta.get('nmt_version', '?')}); this nmt {__version__} reads up to "
            f"{META_FORMAT_VERSION}; upgrade nmt"
        )
    if not isinstance(meta.get("checksums"), dict):  # written before nmt recorded them (format 0)
        raise DataError(
            f"{meta_path} records no checksums of its offsets files (an older data directory), so a corrupted one "
            f'would go unnoticed; re-run "nmt preprocess" to remake {data_dir}'
        )
    return meta


def load_vocab(data_dir: Path, meta: dict[str, Any] | None = None) -> Vocab:
    """The data directory's sentencepiece model, checked against the sha256 its meta.json recorded."""
    path = data_dir / SPM_FILE
    vocab = Vocab.load(path)
    expected = (meta or load_meta(data_dir)).get("spm_sha256")
    if expected is not None and vocab.sha256 != expected:
        raise DataError(
            f"{path} (sha256 {vocab.sha256[:12]}) is not the model {data_dir / META_FILE} was "
            f'written with (sha256 {expected[:12]}); re-run "nmt preprocess"'
        )
    return vocab


def check_ids(array: TokenArray, n_pieces: int, path: Path) -> None:
    """Every id names a piece of the vocabulary (meta.json checksums the offsets, not the tokens): an id
    beyond it would end in an IndexError inside the embedding. One pass over the tokens (numpy's max)."""
    if not len(array.tokens) or int(array.tokens.max()) < n_pieces:
        return
    position = int(np.argmax(array.tokens >= n_pieces))
    sentence = int(np.searchsorted(array.offsets, position, side="right"))  # 1-based
    raise DataError(
        f"{path}: sentence {sentence} holds token id {int(array.tokens[position])}, beyond the vocabulary's "
        f'{n_pieces} pieces: the file was changed or corrupted; re-run "nmt preprocess"'
    )


def checksum_of(data_dir: Path, meta: dict[str, Any], name: str) -> str:
    """The sha256 meta.json recorded for the offsets file `name`; DataError when it recorded none."""
    checksum = meta["checksums"].get(name)
    if not isinstance(checksum, str):
        raise DataError(
            f"{data_dir / META_FILE} records no checksum of {name}, so a corrupted file would go unnoticed; "
            're-run "nmt preprocess"'
        )
    return checksum


class ParallelDataset:
    """Pairs of token-id arrays (no EOS) for one split; lengths are exposed for batching."""

    def __init__(self, data_dir: Path, split: str) -> None:
        meta = load_meta(data_dir)
        if split not in meta["splits"]:
            raise DataError(f"{data_dir} has no split {split!r}; it has {', '.join(meta['splits'])}")
        self.split = split
        src, tgt = f"{split}.{meta['source_lang']}", f"{split}.{meta['target_lang']}"
        self.src = TokenArray(data_dir / src, checksum_of(data_dir, meta, f"{src}.idx.npy"))
        self.tgt = TokenArray(data_dir / tgt, checksum_of(data_dir, meta, f"{tgt}.idx.npy"))
        if len(self.src) != len(self.tgt):
            raise DataError(
                f"{data_dir}: split {split} has {len(self.src)} source and {len(self.tgt)} "
                'target sentences; re-run "nmt preprocess"'
            )
        n_pieces = meta.get("n_pieces", meta["vocab_size"])
        for array, name in ((self.src, src), (self.tgt, tgt)):
            check_ids(array, n_pieces, data_dir / f"{name}.bin.npy")

    @property
    def src_lens(self) -> np.ndarray:
        return self.src.lengths

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.tgt.lengths

    def __len__(self) -> int:
        return len(self.src)
