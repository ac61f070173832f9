"""Atomic writes with fsync: the one place the repository makes a file or directory appear whole.

A reader (or a process restarted after a kill -9 or a power loss) sees either the previous content or
the new one, never a partial file: data goes to a hidden temporary sibling, is fsynced, then renamed
over the target, and the parent directory is fsynced so the rename itself is durable.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_text",
    "fsync_path",
    "new_file_mode",
    "publish_directory",
    "replace_durably",
]


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory by path (a directory's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_file_mode() -> int:
    """The permission bits a newly created file gets here: 0o666 less the process's umask."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):  # not Linux, or a kernel without the field
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def _temporary_sibling(target: Path, kind: str = "tmp") -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def replace_durably(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """``os.replace(source, target)`` (one rename, atomic on POSIX) then fsync the parent directory."""
    os.replace(source, target)
    fsync_path(Path(target).parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds the old or the new bytes, never a mix."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace_durably(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """``atomic_write_bytes`` for text."""
    atomic_write_bytes(path, text.encode(encoding))


def publish_directory(
    staging: str | os.PathLike, target: str | os.PathLike, fsync_files: bool = True
) -> None:
    """Make a complete directory ``staging`` take the place of ``target``, in two renames.

    Everything under ``staging`` is fsynced first (with ``fsync_files=False`` only its
    directories: the files' writers synced them, e.g. each rank its own). Then an existing ``target`` is moved aside to a
    hidden ``.NAME.old-*`` sibling, and ``staging`` is renamed to ``target`` (the old one is deleted
    afterwards). A kill between the two renames leaves ``target`` missing and the previous content
    complete under ``.NAME.old-*`` (``load_model`` names it in its error).
    """
    staging, target = Path(staging), Path(target)
    if fsync_files:
        for child in staging.rglob("*"):
            fsync_path(child)
    else:
        for directory, _, _ in os.walk(staging):
            fsync_path(directory)
    fsync_path(staging)
    trash = None
    if target.exists():
        trash = _temporary_sibling(target, "old")
        os.rename(target, trash)
    os.rename(staging, target)
    fsync_path(target.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory to fill; on success ``publish_directory`` puts it in
    the place of ``path`` (two renames, see there).

    If the block raises, ``path`` keeps its previous content and the temporary directory is removed;
    if the process dies, it stays as a hidden ``.NAME.tmp-*`` sibling that readers ignore.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
        publish_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
