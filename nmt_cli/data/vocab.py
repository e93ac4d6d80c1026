"""The joint SentencePiece vocabulary: training, loading, and the pinned special ids."""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt_cli.errors import DataError

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class Vocab:
    """A SentencePiece model held as bytes, so that it can travel inside checkpoints."""

    def __init__(self, model_bytes: bytes, source: str = "<bytes>") -> None:
        self.model_bytes = bytes(model_bytes)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.model_bytes)
        except (RuntimeError, OSError, TypeError) as e:
            raise DataError(f"{source} is not a sentencepiece model ({e})") from None
        specials = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if specials != (PAD, UNK, BOS, EOS):
            raise DataError(
                f"{source} has special ids pad,unk,bos,eos={specials}; nmt needs "
                f"{(PAD, UNK, BOS, EOS)} (train it with pad_id=0 unk_id=1 bos_id=2 eos_id=3)"
            )
        # Tags (`nmt preprocess --tags`) are the control pieces that end the vocabulary: no text encodes to them,
        # decoding drops them, and a search outputs only the pieces before them (`n_outputs`).
        self.n_outputs = self.sp.get_piece_size()
        while self.n_outputs > EOS + 1 and self.sp.is_control(self.n_outputs - 1):
            self.n_outputs -= 1
        self.tags = [self.sp.id_to_piece(i) for i in range(self.n_outputs, self.sp.get_piece_size())]

    @classmethod
    def load(cls, path: Path) -> Vocab:
        if path.is_dir():
            raise DataError(f"sentencepiece model {path} is a directory; give the .model file")
        if not path.is_file():
            raise DataError(f"no sentencepiece model at {path}")
        return cls(path.read_bytes(), str(path))

    @property
    def sha256(self) -> str:
        """The model's identity: data directories and checkpoints made with it are bound by this hash."""
        return hashlib.sha256(self.model_bytes).hexdigest()

    @property
    def n_pieces(self) -> int:
        return self.sp.get_piece_size()

    @property
    def padded_size(self) -> int:
        """Embedding rows: the piece count rounded up to a multiple of 8 (faster matmuls)."""
        return (self.n_pieces + 7) // 8 * 8

    def encode(self, lines: Sequence[str], n_threads: int = 1) -> list[list[int]]:
        """Piece ids of each line; one thread encodes line by line, since sentencepiece's list call starts a thread
        pool, costly while a search keeps the cores busy (`benchmarks/bench_serve.py`)."""
        if n_threads == 1:
            return [self.sp.encode(line, out_type=int) for line in lines]
        return self.sp.encode(list(lines), out_type=int, num_threads=n_threads)

    def encode_arrays(self, lines: Sequence[str]) -> list[np.ndarray]:
        """`encode`'s piece ids of each line as an int64 array ("" gives an empty one)."""
        return [np.asarray(ids, dtype=np.int64) for ids in self.encode(lines)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.sp.decode([int(i) for i in ids if i < self.n_pieces])

    def pieces(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        return [self.sp.id_to_piece(int(i)) if i < self.n_pieces else "<madeup>" for i in ids]

    def piece_ids(self, pieces: Sequence[str]) -> list[int]:
        """The ids of pieces as `pieces` writes them (generate's H- lines, jsonl's tokens).

        Raises:
            DataError: a piece the vocabulary lacks, or a control piece (padding, BOS, EOS, a tag) no output holds.
        """
        ids = [self.sp.piece_to_id(piece) for piece in pieces]
        for piece, i in zip(pieces, ids):
            if i in (PAD, BOS, EOS) or i >= self.n_outputs or self.sp.id_to_piece(i) != piece:
                raise DataError(f"{piece!r} is not a piece an output may hold")
        return ids

    def write_vocab(self, path: Path) -> None:
        """A human-readable vocabulary: one `piece<TAB>id` per line."""
        with path.open("w", encoding="utf-8") as f:
            for i in range(self.n_pieces):
                f.write(f"{self.sp.id_to_piece(i)}\t{i}\n")


def train_spm(
    input_paths: Sequence[Path],
    model_prefix: Path,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    max_sentences: int,
    n_threads: int = 1,
    control_symbols: Sequence[str] = (),
    tags: Sequence[str] = (),
) -> None:
    """Train one joint model on all inputs, sampling at most `max_sentences` lines. `control_symbols` (tree tokens)
    and `tags` (the vocabulary's last ids) get ids of their own that encoding text never produces.
    """
    # Written here, not by sentencepiece, whose file writing ignores a full disk and leaves a truncated model.
    trained = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(str(p) for p in input_paths),
            model_writer=trained,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD,
            unk_id=UNK,
            bos_id=BOS,
            eos_id=EOS,
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            num_threads=n_threads,
            minloglevel=2,
            max_sentence_length=1 << 16,
            **({"control_symbols": [*control_symbols, *tags]} if control_symbols or tags else {}),  # type: ignore[arg-type]
        )
    except RuntimeError as e:
        message = str(e)
        too_high = re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", message)
        if too_high:
            raise DataError(
                f"--vocab-size {too_high.group(1)} is too large for this training data; "
                f"sentencepiece allows at most {too_high.group(2)}"
            ) from None
        raise DataError(f"sentencepiece training failed: {message.splitlines()[-1]}") from None
    model = without_run_details(trained.getvalue())
    if tags:  # sentencepiece puts them after eos; moved last (a piece's id is its place), the search's bound
        pieces = [raw for number, _, raw in _proto_fields(model) if number == PIECES]
        first = EOS + 1 + len(control_symbols)
        pieces[first:] = pieces[first + len(tags) :] + pieces[first : first + len(tags)]
        model = b"".join(pieces) + b"".join(raw for number, _, raw in _proto_fields(model) if number != PIECES)
    Path(f"{model_prefix}.model").write_bytes(model)


# A ModelProto's trainer_spec (field 2) records its input files (1), model_prefix (2) and num_threads (16): dropped,
# so that one corpus and settings give the same spm.model bytes wherever preprocess runs (the checks compare bytes).
TRAINER_SPEC, RUN_DETAILS = 2, frozenset({1, 2, 16})
PIECES = 1  # a ModelProto's repeated field of pieces, in id order


def without_run_details(model: bytes) -> bytes:
    """A serialized sentencepiece model without the trainer_spec fields in RUN_DETAILS (protobuf wire format)."""
    out = bytearray()
    for number, payload, raw in _proto_fields(model):
        if number != TRAINER_SPEC:
            out += raw
            continue
        spec = b"".join(field for n, _, field in _proto_fields(payload) if n not in RUN_DETAILS)
        out += _varint(TRAINER_SPEC << 3 | 2) + _varint(len(spec)) + spec
    return bytes(out)


def _proto_fields(buf: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """(field number, payload of a length-delimited field or b"", the field as encoded) of a message."""
    i = 0
    while i < len(buf):
        start = i
        key, i = _read_varint(buf, i)
        wire, payload = key & 7, b""
        if wire == 0:
            _, i = _read_varint(buf, i)
        elif wire == 2:
            size, i = _read_varint(buf, i)
            payload, i = buf[i : i + size], i + size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise DataError(f"sentencepiece model: unexpected protobuf wire type {wire}")
        yield key >> 3, payload, buf[start:i]


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
