"""Packing per the recipe, and the writer that stores packed rows as ``.npy`` shards.

Every document becomes ``[BOS, *ids, EOS]`` and is appended to a buffer; as soon as the buffer holds at
least ``row_length = block_size + 1`` tokens, its first ``row_length`` tokens are emitted as one row and
the rest is dropped, so every row starts at a document start. The overflow always belongs to the
document just appended (the buffer was shorter than a row before it); if that document comes from a
"keep all" source, the overflow is kept and continues into the next rows instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

SHARD_BYTES = 128 * 2**20


def file_sha256(path: Path, chunk: int = 4 * 2**20) -> str:
    """SHA-256 of a file, read in chunks (shards are larger than one read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def row_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class Packer:
    """Turns a stream of tokenized documents into rows of ``row_length`` tokens."""

    def __init__(self, row_length: int, bos_id: int, eos_id: int) -> None:
        if row_length < 2:
            raise ValueError(f"row_length must be at least 2, got {row_length}")
        self.row_length = row_length
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.buffer: list[int] = []
        self.dropped_tokens = 0
        self.documents = 0

    def add(self, ids: list[int], keep_all: bool = False) -> Iterator[list[int]]:
        """Append one document's token ids (without BOS/EOS); yield the rows it completes."""
        self.documents += 1
        self.buffer.extend((self.bos_id, *ids, self.eos_id))
        while len(self.buffer) >= self.row_length:
            row, rest = self.buffer[: self.row_length], self.buffer[self.row_length :]
            if keep_all:
                self.buffer = rest
            else:
                self.dropped_tokens += len(rest)
                self.buffer = []
            yield row

    def finish(self) -> int:
        """Drop the final partial row; return how many tokens it held."""
        left = len(self.buffer)
        self.dropped_tokens += left
        self.buffer = []
        return left


def pack(
    documents: Iterable[tuple[list[int], bool]], row_length: int, bos_id: int, eos_id: int
) -> Iterator[list[int]]:
    """Rows from ``(ids, keep_all)`` documents; the final partial buffer is dropped."""
    packer = Packer(row_length, bos_id, eos_id)
    for ids, keep_all in documents:
        yield from packer.add(ids, keep_all)
    packer.finish()


class ShardWriter:
    """Writes rows to ``{prefix}-00000.npy``, … of at most ``SHARD_BYTES`` each."""

    def __init__(self, directory: Path, prefix: str, row_length: int, dtype: np.dtype) -> None:
        self.directory = Path(directory)
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self.rows_per_shard = max(1, SHARD_BYTES // (row_length * self.dtype.itemsize))
        self.buffer = np.empty((self.rows_per_shard, row_length), dtype=self.dtype)
        self.filled = 0
        self.shards: list[list] = []  # [file name, rows, bytes, sha256]
        self.total_rows = 0

    def write(self, row: list[int]) -> None:
        self.buffer[self.filled] = row
        self.filled += 1
        if self.filled == self.rows_per_shard:
            self._flush()

    def _flush(self) -> None:
        if not self.filled:
            return
        name = f"{self.prefix}-{len(self.shards):05d}.npy"
        path = self.directory / name
        np.save(path, self.buffer[: self.filled])
        self.shards.append([name, self.filled, path.stat().st_size, file_sha256(path)])
        self.total_rows += self.filled
        self.filled = 0

    def close(self) -> list[list]:
        self._flush()
        return self.shards
