"""Text checks and the on-disk format: one flat token array (.npy) plus int64 offsets per split and language.

`{split}.{lang}.bin.npy` holds every sentence's piece ids back to back, without EOS, in the smallest
unsigned dtype that fits the vocabulary; `{split}.{lang}.idx.npy` holds n+1 offsets into it.
Both are opened with `np.load(..., mmap_mode="r")`, so reading never loads a corpus into memory.
"""

from __future__ import annotations

import hashlib
import shutil
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from nmt_cli.errors import DataError


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def check_text_file(path: Path) -> int:
    """Count lines and check that every line is valid UTF-8; DataError names file and line otherwise."""
    if path.is_dir():
        raise DataError(f"input file {path} is a directory; give a text file")
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    n_lines = 0
    with path.open("rb") as f:
        for n_lines, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n_lines}: invalid UTF-8 (byte {e.start})") from None
    return n_lines


def read_pairs(src_path: Path, tgt_path: Path, chunk_size: int) -> Iterator[tuple[list[str], list[str]]]:
    """Stream line-aligned chunks of (source lines, target lines), newline stripped.

    Lines end at "\n" only (newline="\n"; check_text_file counts them so): in the default text mode a stray
    "\r" inside a line would split it in two, and every later pair of the corpus would be misaligned.
    """
    with src_path.open(encoding="utf-8", newline="\n") as fs, tgt_path.open(encoding="utf-8", newline="\n") as ft:
        src_chunk: list[str] = []
        tgt_chunk: list[str] = []
        for s, t in zip(fs, ft):
            src_chunk.append(s.rstrip("\r\n"))
            tgt_chunk.append(t.rstrip("\r\n"))
            if len(src_chunk) == chunk_size:
                yield src_chunk, tgt_chunk
                src_chunk, tgt_chunk = [], []
        if src_chunk:
            yield src_chunk, tgt_chunk


class TokenWriter:
    """Appends sentences to a raw token file; `finish()` turns it into `.bin.npy` + `.idx.npy`."""

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        self.prefix = prefix
        self.dtype = dtype
        self.raw_path = prefix.with_name(prefix.name + ".raw")
        self.file = self.raw_path.open("wb")
        self.lengths = array("q")

    def add(self, sentences: list[list[int]]) -> None:
        self.lengths.extend(len(s) for s in sentences)
        flat = [tok for s in sentences for tok in s]
        self.file.write(np.asarray(flat, dtype=self.dtype).tobytes())

    def finish(self) -> int:
        """Write the .npy files and return the number of tokens."""
        self.file.close()
        lengths = np.frombuffer(self.lengths, dtype=np.int64) if len(self.lengths) else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(self.prefix.with_name(self.prefix.name + ".idx.npy"), offsets)
        n_tokens = int(offsets[-1])
        with open(self.prefix.with_name(self.prefix.name + ".bin.npy"), "wb") as out:
            header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (n_tokens,)}
            np.lib.format.write_array_header_1_0(out, header)
            with self.raw_path.open("rb") as raw:
                shutil.copyfileobj(raw, out, 1 << 24)
        self.raw_path.unlink()
        return n_tokens


class TokenArray:
    """Read side of the format: sentence i is `tokens[offsets[i]:offsets[i+1]]`.

    Checked at open: both files load, the offsets start at 0, never decrease and end at the token count,
    and (when `idx_sha256` is given, from meta.json) the offsets file is the one preprocess wrote.
    """

    def __init__(self, prefix: Path, idx_sha256: str | None = None) -> None:
        bin_path = prefix.with_name(prefix.name + ".bin.npy")
        idx_path = prefix.with_name(prefix.name + ".idx.npy")
        for path in (bin_path, idx_path):
            if not path.is_file():
                raise DataError(f'missing {path}; run "nmt preprocess" to create the data directory')
        self.tokens = load_array(bin_path, mmap=True)
        if idx_sha256 is not None and file_sha256(idx_path) != idx_sha256:
            raise DataError(
                f"{idx_path} does not match the checksum in meta.json: the file was changed or "
                'corrupted; re-run "nmt preprocess"'
            )
        self.offsets = load_array(idx_path, mmap=False)
        check_offsets(self.offsets, len(self.tokens), idx_path, bin_path)
        self.lengths = np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_array(path: Path, mmap: bool) -> np.ndarray:
    """np.load with numpy's errors for a truncated or foreign file turned into one DataError."""
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f'{path} is truncated or not an nmt data file ({e}); re-run "nmt preprocess"') from None
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise DataError(
            f"{path} holds a {array.dtype} array of shape {array.shape}, not token ids or offsets; "
            're-run "nmt preprocess"'
        )
    return array


def check_offsets(offsets: np.ndarray, n_tokens: int, idx_path: Path, bin_path: Path) -> None:
    """Offsets start at 0, never decrease, and end at the token count; DataError naming the file otherwise."""
    if len(offsets) == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise DataError(
            f'{idx_path} is corrupted (its offsets do not start at 0 and increase); re-run "nmt preprocess"'
        )
    if offsets[-1] != n_tokens:
        raise DataError(
            f"{idx_path} ends at token {int(offsets[-1])} but {bin_path} has {n_tokens} tokens; "
            'one of them is truncated or corrupted; re-run "nmt preprocess"'
        )
