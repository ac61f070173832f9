"""Readers for user corpora: directories of text/code files, JSONL and parquet with a ``text`` column,
and local Hugging Face ``datasets`` (``hf:PATH``).

Every reader yields :class:`Document` objects and records what it replaced or skipped in a
:class:`ReadStats`. Invalid UTF-8 is replaced by U+FFFD (one per bad byte) or, with the "skip" policy,
the file / line / row is skipped; both are counted. A file that cannot be read at all is a
:class:`DataError` naming it.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .config import DataError

BINARY_PROBE_BYTES = 8192
_SURROGATE_ESCAPES = re.compile("[\udc80-\udcff]")
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Document:
    """One document: its text, the configured source it came from and a finer kind for stats."""

    text: str
    source: str
    kind: str = ""


@dataclass
class ReadStats:
    """What the readers replaced or skipped, and how many documents each source gave."""

    invalid_utf8_files: int = 0
    invalid_utf8_bytes_replaced: int = 0
    invalid_utf8_skipped: int = 0
    binary_files_skipped: int = 0
    empty_documents_skipped: int = 0
    docs_per_source: Counter = field(default_factory=Counter)
    docs_per_kind: Counter = field(default_factory=Counter)
    bytes_per_source: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {
            "invalid_utf8_files": self.invalid_utf8_files,
            "invalid_utf8_bytes_replaced": self.invalid_utf8_bytes_replaced,
            "invalid_utf8_skipped": self.invalid_utf8_skipped,
            "binary_files_skipped": self.binary_files_skipped,
            "empty_documents_skipped": self.empty_documents_skipped,
            "docs_per_source": dict(sorted(self.docs_per_source.items())),
            "docs_per_kind": dict(sorted(self.docs_per_kind.items())),
            "bytes_per_source": dict(sorted(self.bytes_per_source.items())),
        }


def decode_utf8(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each invalid byte by U+FFFD; returns (text, invalid byte count)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    escaped = data.decode("utf-8", errors="surrogateescape")
    text, bad = _SURROGATE_ESCAPES.subn("\ufffd", escaped)
    return text, bad


def replace_surrogates(text: str) -> tuple[str, int]:
    """Replace lone surrogates (valid in JSON escapes, not encodable as UTF-8) by U+FFFD."""
    if text.isascii():
        return text, 0
    return _SURROGATES.subn("\ufffd", text)


class _Decoder:
    """Applies the invalid-UTF-8 policy and counts what it did, per file."""

    def __init__(self, policy: str, stats: ReadStats) -> None:
        self.policy = policy
        self.stats = stats

    def __call__(self, data: bytes, file_flagged: list[bool]) -> str | None:
        return self.check(*decode_utf8(data), file_flagged)

    def check(self, text: str, bad: int, file_flagged: list[bool]) -> str | None:
        """Apply the policy to ``text`` that had ``bad`` invalid bytes or code points."""
        if not bad:
            return text
        if not file_flagged[0]:
            self.stats.invalid_utf8_files += 1
            file_flagged[0] = True
        if self.policy == "skip":
            self.stats.invalid_utf8_skipped += 1
            return None
        self.stats.invalid_utf8_bytes_replaced += bad
        return text


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read corpus file {path}: {exc.strerror or exc}") from exc


def _is_hidden(rel: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in rel.parts)


def list_text_files(directory: Path, seed: int) -> list[Path]:
    """Every regular, non-hidden file under ``directory``, in a seeded shuffled order."""
    files = []
    for root, dirs, names in os.walk(directory, onerror=_raise_walk_error):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if not _is_hidden(path.relative_to(directory)) and not path.is_symlink():
                files.append(path)
    random.Random(f"files:{seed}").shuffle(files)
    return files


def _raise_walk_error(exc: OSError) -> None:
    raise DataError(f"cannot list corpus directory {exc.filename}: {exc.strerror or exc}") from exc


def read_directory(
    directory: Path, source: str, seed: int, policy: str, stats: ReadStats
) -> Iterator[Document]:
    """Each text/code file is one document; ``.jsonl`` and ``.parquet`` files inside are read as
    such; binary files (a NUL byte near the start) are skipped."""
    decode = _Decoder(policy, stats)
    for path in list_text_files(directory, seed):
        if path.suffix == ".jsonl":
            yield from read_jsonl(path, source, policy, stats)
            continue
        if path.suffix == ".parquet":
            yield from read_parquet(path, source, policy, stats)
            continue
        data = _read_bytes(path)
        if b"\x00" in data[:BINARY_PROBE_BYTES]:
            stats.binary_files_skipped += 1
            continue
        text = decode(data, [False])
        if text is not None:
            yield Document(text, source, path.suffix.lstrip(".") or "text")


def read_jsonl(path: Path, source: str, policy: str, stats: ReadStats) -> Iterator[Document]:
    """One JSON object per line with a string ``text`` field; blank lines are ignored.

    The file is read line by line, so a JSONL file larger than memory streams through."""
    decode = _Decoder(policy, stats)
    flagged = [False]
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot read corpus file {path}: {exc.strerror or exc}") from exc
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            line = decode(raw.rstrip(b"\n"), flagged)
            if line is None:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{path}:{lineno}: expected an object with a string 'text' field")
            text = decode.check(*replace_surrogates(record["text"]), flagged)
            if text is not None:
                yield Document(text, source, "jsonl")


def read_parquet(path: Path, source: str, policy: str, stats: ReadStats) -> Iterator[Document]:
    """The ``text`` column (string or binary) of a parquet file, batch by batch.

    Values are read as bytes and decoded here, so invalid UTF-8 in a string column is counted and
    replaced like anywhere else instead of failing halfway through.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read parquet file {path}: {exc}") from exc
    if "text" not in parquet.schema_arrow.names:
        raise DataError(f"{path} has no 'text' column (columns: {parquet.schema_arrow.names})")
    column_type = parquet.schema_arrow.field("text").type
    if pa.types.is_large_string(column_type) or pa.types.is_large_binary(column_type):
        as_bytes = pa.large_binary()
    elif pa.types.is_string(column_type) or pa.types.is_binary(column_type):
        as_bytes = pa.binary()
    else:
        raise DataError(f"{path}: the 'text' column has type {column_type}, not string or binary")
    decode = _Decoder(policy, stats)
    flagged = [False]
    try:
        for batch in parquet.iter_batches(columns=["text"], batch_size=1024):
            for value in batch.column(0).cast(as_bytes).to_pylist():
                if value is not None and (text := decode(value, flagged)) is not None:
                    yield Document(text, source, "parquet")
    except pa.ArrowException as exc:
        raise DataError(f"cannot read parquet file {path}: {exc}") from exc


HF_PREFIX = "hf:"
HF_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
HF_BATCH = 1024


def split_hf_source(source: str) -> tuple[Path, str | None]:
    """``hf:PATH`` or ``hf:PATH@split`` → (PATH, split or None)."""
    spec = source[len(HF_PREFIX) :]
    path, split = Path(spec).expanduser(), None
    if not path.exists() and "@" in spec:
        head, _, split = spec.rpartition("@")
        path = Path(head).expanduser()
    if not path.exists():
        raise DataError(f"corpus source {source!r}: {path} does not exist")
    return path, split or None


def _open_hf_dataset(path: Path, split: str | None, source: str):
    """A ``datasets`` Dataset (memory-mapped Arrow) or IterableDataset (streamed local files)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never reach the Hub
    try:
        import datasets
    except ImportError as exc:
        raise DataError(
            f"corpus source {source!r} needs Hugging Face datasets: pip install -e '.[datasets]'"
        ) from exc
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as exc:
            raise DataError(
                f"corpus source {source!r}: {path} is not a datasets save_to_disk directory ({exc})"
            ) from exc
    else:
        builder = HF_FILE_BUILDERS.get(path.suffix)
        if builder is None:
            raise DataError(
                f"corpus source {source!r}: {path.suffix or 'no suffix'} is not one of "
                f"{', '.join(HF_FILE_BUILDERS)}"
            )
        loaded = datasets.load_dataset(builder, data_files=str(path), streaming=True)
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        names = sorted(loaded)
        if split is None:
            split = "train" if "train" in loaded else (names[0] if len(names) == 1 else None)
        if split not in loaded:
            raise DataError(
                f"corpus source {source!r}: choose a split with hf:{path}@SPLIT (have {names})"
            )
        loaded = loaded[split]
    elif split is not None:
        raise DataError(f"corpus source {source!r}: {path} holds one dataset, not split {split!r}")
    return loaded


def read_hf_dataset(source: str, policy: str, stats: ReadStats) -> Iterator[Document]:
    """The ``text`` column of a local Hugging Face dataset, batch by batch (never all in memory)."""
    path, split = split_hf_source(source)
    dataset = _open_hf_dataset(path, split, source)
    columns = list(dataset.column_names or [])
    if "text" not in columns:
        raise DataError(f"corpus source {source!r} has no 'text' column (columns: {columns})")
    decode = _Decoder(policy, stats)
    flagged = [False]
    for batch in dataset.select_columns(["text"]).iter(batch_size=HF_BATCH):
        for value in batch["text"]:
            if value is None:
                continue
            if isinstance(value, bytes):
                text = decode(value, flagged)
            elif isinstance(value, str):
                text = decode.check(*replace_surrogates(value), flagged)
            else:
                raise DataError(
                    f"corpus source {source!r}: a 'text' value is {type(value).__name__}"
                )
            if text is not None:
                yield Document(text, source, "hf")


def read_source(source: str, seed: int, policy: str, stats: ReadStats) -> Iterator[Document]:
    """Documents of one configured source: ``hf:PATH`` or a directory, .jsonl, .parquet or text file."""
    if source.startswith(HF_PREFIX):
        yield from read_hf_dataset(source, policy, stats)
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"corpus source {source!r} does not exist")
    if path.is_dir():
        yield from read_directory(path, source, seed, policy, stats)
    elif path.suffix == ".jsonl":
        yield from read_jsonl(path, source, policy, stats)
    elif path.suffix == ".parquet":
        yield from read_parquet(path, source, policy, stats)
    else:
        text = _Decoder(policy, stats)(_read_bytes(path), [False])
        if text is not None:
            yield Document(text, source, path.suffix.lstrip(".") or "text")


def source_fingerprint(source: str) -> list[list]:
    """``[relative path, size, mtime_ns]`` of every file a path or ``hf:`` source reads.

    File metadata only (one ``stat`` per file, no content read), so deciding whether a prepared
    build is still current costs a directory listing, not a pass over a corpus larger than memory.
    """
    if source.startswith(HF_PREFIX):
        path, _ = split_hf_source(source)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise DataError(f"corpus source {source!r} does not exist")
    if path.is_file():
        files = [path]
    else:
        files = []
        for root, dirs, names in os.walk(path, onerror=_raise_walk_error):
            dirs.sort()
            files += [Path(root) / n for n in sorted(names)]
    entries = []
    for file in files:
        try:
            info = file.stat()
        except OSError as exc:
            raise DataError(f"cannot stat corpus file {file}: {exc.strerror or exc}") from exc
        rel = file.name if file == path else str(file.relative_to(path))
        entries.append([rel, info.st_size, info.st_mtime_ns])
    return entries
