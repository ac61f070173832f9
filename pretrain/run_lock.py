"""One run per output directory: an exclusive ``flock`` on ``OUT/.run.lock`` held for the whole run.

The file names the holder (host, pid, start time) so a second launch is refused in one line that
says who holds it. The kernel drops a flock when its process dies, so a lock never outlives its
run; a lock file that still names a holder when it is taken over was left by a run that ended
without releasing it (killed, or its node lost), and that is reported. A clean release empties
the file. On a file system without flock support the run goes on and says the check is off.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK_FILE = ".run.lock"
CONTENTION_S = 2.0  # a launcher's momentary check (``check_unlocked``) is waited out


class RunLockedError(RuntimeError):
    """Another run holds the output directory; the message names it."""


def describe_holder(text: str) -> str:
    """'pid P on host H since T' from a lock file's content (or what it holds)."""
    try:
        holder = json.loads(text)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
        return f"pid {holder['pid']} on host {holder['host']} since {started}"
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError):
        return f"an unknown holder ({text.strip()[:80]!r})"


class RunLock:
    """The held lock of one run directory (``acquire``, then ``release``)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, out: Path) -> RunLock:
        """Take the lock of ``out`` or raise RunLockedError naming its holder."""
        out.mkdir(parents=True, exist_ok=True)
        path = out / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock_within(fd, CONTENTION_S)
        except BlockingIOError:
            holder = describe_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            os.close(fd)
            raise RunLockedError(
                f"{out} is in use by another run ({holder}); wait for it to end or choose a "
                "new --out"
            ) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            print(f"{path}: this file system has no flock: the one-run-per-directory check is off")
            return cls(path, None)
        cls._report_stale(path, os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        cls._write_holder(fd)
        return cls(path, fd)

    @staticmethod
    def _report_stale(path: Path, text: str) -> None:
        if text.strip():
            print(
                f"{path}: a stale lock of {describe_holder(text)} was left by a run that ended "
                "without releasing it; taking it over"
            )

    @staticmethod
    def _write_holder(fd: int) -> None:
        holder: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
        holder["started"] = time.time()
        data = (json.dumps(holder) + "\n").encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    def release(self) -> None:
        """Empty the file (a clean end) and drop the lock."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)


def _flock_within(fd: int, seconds: float) -> None:
    """An exclusive flock, retried for ``seconds`` (BlockingIOError when still held)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def check_unlocked(out: Path) -> None:
    """RunLockedError when a live run holds ``out`` (a launcher's check before it starts ranks;
    the lock itself is taken by rank 0 of the run)."""
    if not (out / LOCK_FILE).is_file():
        return
    fd = os.open(out / LOCK_FILE, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = describe_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        raise RunLockedError(
            f"{out} is in use by another run ({holder}); wait for it to end or choose a new --out"
        ) from None
    except OSError:
        pass  # no flock here: rank 0 says so
    finally:
        os.close(fd)


@contextmanager
def hold_run_directory(out: Path, ctx: Any) -> Iterator[None]:
    """Rank 0 holds the lock of ``out`` for the block; every rank raises RunLockedError (the same
    message) when another run holds it."""
    lock, problem = None, None
    if ctx.is_main:
        try:
            lock = RunLock.acquire(out)
        except RunLockedError as exc:
            problem = str(exc)
    problem = ctx.all_gather_object(problem)[0]
    if problem:
        raise RunLockedError(problem)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
