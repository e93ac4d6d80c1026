"""A parallel dataset over the memory-mapped arrays that `nmt preprocess` wrote."""

from __future__ import annotations

import json
from collections.abc import Iterable
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
# The training split; several named corpora (`nmt preprocess --trainpref NAME=PREFIX,...`) are splits train.NAME.
TRAIN = "train"


def train_corpora(meta: dict[str, Any]) -> dict[str, str]:
    """A data directory's training corpora: name -> split (one unnamed corpus is named train)."""
    if TRAIN in meta["splits"]:
        return {TRAIN: TRAIN}
    return {split[len(TRAIN) + 1 :]: split for split in meta["splits"] if split.startswith(f"{TRAIN}.")}


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
    """Every id names a piece of the vocabulary (meta.json checksums the offsets, not the tokens)."""
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


class Joined:
    """Token arrays read as one, sentence after sentence, each of array k's sentences after `tags[k]` (an id)."""

    def __init__(self, arrays: list[TokenArray], tags: list[int | None]) -> None:
        self.arrays, self.tags = arrays, tags
        self.starts = np.cumsum([0] + [len(a) for a in arrays])
        self.lengths = np.concatenate([a.lengths + (tag is not None) for a, tag in zip(arrays, tags)])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        ids, tag = self.arrays[k][i - self.starts[k]], self.tags[k]
        return ids if tag is None else np.concatenate(([tag], ids))


class ParallelDataset:
    """Pairs of token-id arrays (no EOS) for one split; lengths are exposed for batching. Split train is every
    training corpus, one after another (`corpora`), a corpus's sources after its tag where `tags` gives one."""

    def __init__(self, data_dir: Path, split: str, tags: dict[str, int] | None = None) -> None:
        meta = load_meta(data_dir)
        named = train_corpora(meta) if split == TRAIN else {split: split}
        if not named or any(s not in meta["splits"] for s in named.values()):
            raise DataError(f"{data_dir} has no split {split!r}; it has {', '.join(meta['splits'])}")
        self.split = split
        sides = [self.arrays(data_dir, meta, s, named.values()) for s in (meta["source_lang"], meta["target_lang"])]
        for name, src, tgt in zip(named.values(), *sides):
            if len(src) != len(tgt):
                raise DataError(
                    f"{data_dir}: split {name} has {len(src)} source and {len(tgt)} target sentences; "
                    're-run "nmt preprocess"'
                )
        sizes = [len(array) for array in sides[0]]
        #: each corpus's sentences, by name: range(start, end) of the whole split
        self.corpora = {name: range(sum(sizes[:k]), sum(sizes[: k + 1])) for k, name in enumerate(named)}
        tag_ids = [(tags or {}).get(name) for name in named]
        self.src: TokenArray | Joined = sides[0][0]  # one corpus untagged: read as preprocess wrote it
        self.tgt: TokenArray | Joined = sides[1][0]
        if tag_ids != [None]:
            self.src, self.tgt = Joined(sides[0], tag_ids), Joined(sides[1], [None] * len(named))
        #: the batches made of it, by the settings that made them (train/epoch_plan.py makes them once a run)
        self.batches: dict[tuple[int, ...], list[list[np.ndarray]]] = {}

    @staticmethod
    def arrays(data_dir: Path, meta: dict[str, Any], lang: str, splits: Iterable[str]) -> list[TokenArray]:
        """The token arrays of one language's splits, each checked against meta.json."""
        arrays = []
        for split in splits:
            name = f"{split}.{lang}"
            arrays.append(TokenArray(data_dir / name, checksum_of(data_dir, meta, f"{name}.idx.npy")))
            check_ids(arrays[-1], meta.get("n_pieces", meta["vocab_size"]), data_dir / f"{name}.bin.npy")
        return arrays

    @property
    def src_lens(self) -> np.ndarray:
        return self.src.lengths

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.tgt.lengths

    def __len__(self) -> int:
        return len(self.src)
