"""Checkpoint integrity: a manifest of every file's size and checksum, made while the files are
written and verified before a resume reads them.

    DIR/checkpoints/step-0000100/manifest.json
        {"format": 1, "hash": "xxh3_128", "files": {"shards/shard-00001-model-00001-of-00002.safetensors":
         {"bytes": 123, "digest": "..."}, "ranks/rank-000000.json": {...}, "config.json": {...}, ...}}

Each rank checksums the files it writes itself: DCP's shard files through a file system whose
streams hash the bytes as DCP writes them (``HashingFileSystem``), its own state file from the
bytes it writes. Rank 0 gathers the entries and writes the manifest last, after
``trainer_state.json``, so a checkpoint without its manifest is incomplete. A resume verifies the
files in parallel, every rank a share of the entries (``verify_files``), so a missing, truncated or
corrupted file is named before any of it is read. The checksum is xxHash's XXH3-128 when the
``xxhash`` package is installed (several GB/s per core), else SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystem

from recurrent_model.atomic_io import atomic_write_text

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
CHUNK_BYTES = 8 * 2**20

try:
    import xxhash

    HASH_NAME = "xxh3_128"
except ImportError:  # pragma: no cover - depends on the environment
    xxhash = None
    HASH_NAME = "sha256"


class IntegrityError(RuntimeError):
    """A checkpoint whose files do not match its manifest; the message names the file."""


def new_hasher(name: str = HASH_NAME) -> Any:
    """A streaming hasher of ``name`` (``xxh3_128`` or ``sha256``)."""
    if name == "xxh3_128":
        if xxhash is None:
            raise IntegrityError("the manifest uses xxh3_128, but the xxhash package is missing")
        return xxhash.xxh3_128()
    if name == "sha256":
        return hashlib.sha256()
    raise IntegrityError(f"unknown checksum {name!r} in the manifest")


def digest_bytes(data: bytes) -> dict[str, Any]:
    """The manifest entry of ``data``: its size and checksum."""
    hasher = new_hasher()
    hasher.update(data)
    return {"bytes": len(data), "digest": hasher.hexdigest()}


def digest_file(path: Path, name: str = HASH_NAME, sync: bool = False) -> dict[str, Any]:
    """The manifest entry of a file, read in chunks; with ``sync`` the file is also fsynced (by
    the rank that wrote it, so that publishing needs no fsync of it)."""
    hasher, size = new_hasher(name), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            hasher.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return {"bytes": size, "digest": hasher.hexdigest()}


# Hashing while DCP writes -------------------------------------------------------------------------
class _HashingStream:
    """A write stream that checksums every byte written through it (DCP writes each shard file
    sequentially: ``tell``, ``write``, ``flush``, ``fileno`` for its fsync, ``close``)."""

    def __init__(self, raw: Any) -> None:
        self._raw, self._hasher, self.size = raw, new_hasher(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hasher.update(view)
        self.size += view.nbytes
        return self._raw.write(data)

    def entry(self) -> dict[str, Any]:
        return {"bytes": self.size, "digest": self._hasher.hexdigest()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class HashingFileSystem(FileSystem):
    """DCP's local file system, whose write streams record each file's size and checksum into
    ``digests`` (file name -> entry) as the bytes go out: no second read of the shards."""

    def __init__(self, digests: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.digests = digests

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
            self.digests[Path(path).name] = hashing.entry()


# Writing the manifest -----------------------------------------------------------------------------
def write_hashed_text(path: Path, text: str) -> dict[str, Any]:
    """Write ``text`` atomically and return its manifest entry (hashed from the bytes written)."""
    data = text.encode("utf-8")
    atomic_write_text(path, text)
    return digest_bytes(data)


def write_manifest(directory: Path, files: dict[str, dict[str, Any]]) -> None:
    """``manifest.json`` of a checkpoint directory (rank 0, after every other file)."""
    payload = {"format": MANIFEST_FORMAT, "hash": HASH_NAME, "files": dict(sorted(files.items()))}
    atomic_write_text(directory / MANIFEST, json.dumps(payload, indent=1) + "\n")


def unlisted_files(directory: Path, files: Iterable[str]) -> list[str]:
    """Files under ``directory`` that ``files`` (relative paths) do not list, the manifest aside."""
    listed = set(files) | {MANIFEST}
    found = (p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    return sorted(name for name in found if name not in listed)


# Verifying ----------------------------------------------------------------------------------------
def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint (None when it has none); an unreadable one is an error."""
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        new_hasher(manifest["hash"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(files, dict):
        raise IntegrityError(f"{path} lists no files")
    return manifest


_PARTS = (
    (re.compile(r"^shards/.*-00001-of-\d+\.safetensors$"), "model shard"),
    (re.compile(r"^shards/.*-00002-of-\d+\.safetensors$"), "optimizer shard"),
    (re.compile(r"^ranks/"), "rank state"),
    (re.compile(r"^tokenizer\.json$"), "tokenizer"),
    (re.compile(r"^config\.json$"), "config"),
    (re.compile(r"^trainer_state\.json$"), "trainer state"),
    (re.compile(r"^model.*\.(safetensors|json)$"), "exported weights"),
)


def part_of(name: str) -> str:
    """Which part of a checkpoint a file holds (for the one-line report)."""
    return next((part for pattern, part in _PARTS if pattern.match(name)), "file")


def check_file(directory: Path, name: str, entry: dict[str, Any], hash_name: str) -> str | None:
    """None when ``directory/name`` matches its entry, else one phrase naming what is wrong."""
    path = directory / name
    label = f"{name} ({part_of(name)})"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{label} is missing"
    except OSError as exc:
        return f"{label} is unreadable: {exc}"
    if size != entry["bytes"]:
        kind = "truncated" if size < entry["bytes"] else "longer than written"
        return f"{label} is {kind}: {size} bytes, {entry['bytes']} written"
    try:
        got = digest_file(path, hash_name)
    except OSError as exc:
        return f"{label} is unreadable: {exc}"
    if got["digest"] != entry["digest"]:
        return f"{label} is corrupted: its {hash_name} checksum differs from the one written"
    return None


def verify_files(
    directory: Path, manifest: dict[str, Any], share: int = 0, shares: int = 1
) -> list[str]:
    """Problems with the files of ``manifest`` in share ``share`` of ``shares`` (each rank of a
    resume checks one share, so the files are read in parallel and once)."""
    names = sorted(manifest["files"])[share::shares]
    problems = []
    for name in names:
        problem = check_file(directory, name, manifest["files"][name], manifest["hash"])
        if problem:
            problems.append(problem)
    return problems


@torch.no_grad()
def nonfinite_tensor(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first tensor (this rank's piece of it) holding NaN or inf, else None."""
    for name, tensor in tensors.items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_floating_point() and not bool(torch.isfinite(local).all()):
            return name
    return None
