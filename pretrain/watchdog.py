"""Hangs: collective timeouts that drop from the start-up length to a step-sized one after the first
step (as torchtitan does), a stack dump of every thread when a phase runs past its collective
timeout or a collective fails (``OUT/stacks/rank<k>.txt``, beside the dumps of NCCL's flight
recorder: cluster/flight_recorder.py), and a deadline after SIGTERM for a rank blocked in a
collective.

A Python signal handler runs only when the main thread returns to the interpreter, which a rank
blocked in a C++ collective does not do. Python's C-level handler still writes the signal's number
to the wakeup file descriptor at once, so a thread reading that descriptor sees SIGTERM and, when
the rank has not reached the ranks' agreed stop within ``distributed.stop_grace_s``, writes the
stacks and one line and ends the process (never inside a checkpoint's publish: ``PUBLISH_LOCK``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch.distributed as dist
from torch import nn

from cluster.flight_recorder import STACKS_DIR

TERM_EXIT = 128 + signal.SIGTERM  # the exit status of a process ended by SIGTERM
PUBLISH_LOCK = threading.Lock()  # held by a checkpoint's publish; a forced exit waits for it
PROJECT = Path(__file__).resolve().parent.parent
COLLECTIVE_ERROR = re.compile(
    r"timed out|timeout|connection (closed|reset)|closed by peer|broken pipe|nccl error", re.I
)


class CollectiveFailure(RuntimeError):
    """A collective timed out or lost a peer on this rank; the message names the rank, the step,
    where it waited and the stack dump."""


def stack_file(out: str | Path, rank: int) -> Path:
    return Path(out) / STACKS_DIR / f"rank{rank}.txt"


# Timeouts -------------------------------------------------------------------------------------------
def process_groups(model: nn.Module, extra: Iterable[Any] = ()) -> list[Any]:
    """The default group, every group of the meshes the model's (DTensor) parameters live on, and
    ``extra`` (None entries skipped), each once."""
    from torch.distributed.distributed_c10d import _get_default_group

    groups = [_get_default_group()]
    for param in model.parameters():
        mesh = getattr(param, "device_mesh", None)
        if mesh is not None:
            groups.extend(mesh.get_group(dim) for dim in range(mesh.ndim))
    groups.extend(g for g in extra if g is not None)
    return list({id(g): g for g in groups}.values())


def set_collective_timeout(groups: Iterable[Any], seconds: float) -> None:
    """Every collective of ``groups`` from now on fails after ``seconds`` (gloo and NCCL)."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    for group in groups:
        _set_pg_timeout(timedelta(seconds=seconds), group)


def collective_timeout(group: Any = None) -> float:
    """The timeout, in seconds, of ``group``'s backend (the default group when None)."""
    from torch.distributed.distributed_c10d import _get_default_group

    group = group or _get_default_group()
    device = next(iter(group._device_types))
    return group._get_backend(device).options._timeout.total_seconds()


# Stacks ---------------------------------------------------------------------------------------------
def _short(filename: str) -> str:
    path = Path(filename)
    for root in (*(Path(p) for p in sys.path if p.endswith("site-packages")), PROJECT):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return filename


def _place(frame: FrameType, lineno: int) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name} ({_short(code.co_filename)}:{lineno})"


def _ours(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return Path(filename).is_relative_to(PROJECT) and "site-packages" not in filename


def where(frames: list[tuple[FrameType, int]]) -> str:
    """The innermost function of ``frames`` ((frame, line), outermost first) and, when that is
    outside this project, the project's innermost caller: "all_reduce (torch/...:N), called from
    bucketed_all_reduce.<locals>.flush (pretrain/distributed.py:M)"."""
    if not frames:
        return "an unknown place"
    text = _place(*frames[-1])
    ours = [f for f in frames if _ours(f[0])]
    if ours and ours[-1] is not frames[-1]:
        text += f", called from {_place(*ours[-1])}"
    return text


def thread_frames(ident: int) -> list[tuple[FrameType, int]]:
    """The (frame, line) pairs of a thread's stack, outermost first."""
    frame = sys._current_frames().get(ident)
    return list(traceback.walk_stack(frame))[::-1] if frame is not None else []


def error_frames(error: BaseException) -> list[tuple[FrameType, int]]:
    """The (frame, line) pairs of an exception's traceback, outermost first."""
    return list(traceback.walk_tb(error.__traceback__))


def dump_stacks(path: Path, header: str, error: BaseException | None = None) -> None:
    """Append ``header``, the failed call's traceback (``error``) and every thread's stack."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = {t.ident: t.name for t in threading.enumerate()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {header}\n")
        if error is not None:
            f.write("the failed call (most recent call last):\n")
            f.writelines(traceback.format_tb(error.__traceback__))
            f.write(f"{type(error).__name__}: {first_line(error)}\n")
        for ident, frame in sys._current_frames().items():
            f.write(f"thread {names.get(ident, ident)} (most recent call last):\n")
            f.writelines(traceback.format_stack(frame))
        f.write("\n")


def first_line(error: BaseException) -> str:
    """The error's first line without a C++ source location prefix ("[.../pair.cc:553] ")."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return re.sub(r"^\[[^\]]*\]\s*", "", lines[0])


def is_collective_error(error: BaseException) -> bool:
    """torch's distributed errors, and the plain RuntimeError gloo raises on a timeout or a lost
    peer; never a subclass (this project's named errors may quote an OSError's "timed out")."""
    return isinstance(error, dist.DistError) or (
        type(error) is RuntimeError and bool(COLLECTIVE_ERROR.search(str(error)))
    )


# The watchdog ---------------------------------------------------------------------------------------
class Watchdog:
    """One rank's watcher thread: a stack dump when an armed phase (a step) runs past its limit
    (the collective timeout), the named error when a collective fails, and the SIGTERM deadline."""

    def __init__(self, out: str | Path, rank: int, grace_s: float) -> None:
        self.path, self.rank, self.grace_s = stack_file(out, rank), rank, grace_s
        self._owner = threading.get_ident()  # the thread that trains
        self._cond = threading.Condition()
        self._phase: tuple[str, float, float] | None = None  # label, start, limit
        self._overrun: tuple[str, float, float] | None = None
        self._term_at: float | None = None
        self._stood_down = self._closed = False
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_fd = -1
        threading.Thread(target=self._watch, name="pretrain-watchdog", daemon=True).start()

    @property
    def label(self) -> str:
        return self._phase[0] if self._phase else "between phases"

    def arm(self, label: str, limit_s: float) -> None:
        """A phase starts: dump the stacks if it runs past ``limit_s``."""
        with self._cond:
            self._phase = (label, time.monotonic(), limit_s)
            self._cond.notify()

    def disarm(self) -> None:
        """The phase ended; after an overrun the dump says it finished."""
        with self._cond:
            if self._phase is not None and self._phase is self._overrun:
                label, start, _ = self._phase
                took = time.monotonic() - start
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(f"rank {self.rank}: {label} finished after {took:.1f} s\n\n")
            self._phase = None
            self._cond.notify()

    def stop_agreed(self) -> None:
        """The ranks agreed to stop: the SIGTERM deadline no longer applies (the checkpoint that
        follows runs under the collective timeout)."""
        with self._cond:
            self._stood_down, self._term_at = True, None
            self._cond.notify()

    def failure(self, error: BaseException, timeout_s: float) -> CollectiveFailure | None:
        """``error`` as a CollectiveFailure (its stacks dumped) when it came from a collective."""
        if not is_collective_error(error):
            return None
        kind = "timed out" if re.search(r"timed out|timeout", str(error), re.I) else "failed"
        waited = where(error_frames(error))
        line = (
            f"rank {self.rank}: {self.label}: a collective {kind} in {waited}: {first_line(error)}"
        )
        dump_stacks(self.path, line, error)
        return CollectiveFailure(
            f"{line} (collective timeout {timeout_s:g} s); every thread's stack in {self.path}"
        )

    # SIGTERM ----------------------------------------------------------------------------------------
    def watch_signals(self) -> bool:
        """Learn of SIGTERM at once through the wakeup descriptor (main thread only; False off it).
        The signal's Python handler must be installed (the trainer's)."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            reader.close()
            writer.close()
            return False
        self._wakeup = (reader, writer)
        threading.Thread(target=self._read_signals, args=(reader,), daemon=True).start()
        return True

    def _read_signals(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                with self._cond:
                    if not self._stood_down and self._term_at is None:
                        self._term_at = time.monotonic()
                        self._cond.notify()

    def close(self) -> None:
        """Stop watching; give the wakeup descriptor back."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_fd)
            for sock in self._wakeup:
                sock.close()
            self._wakeup = None

    # The thread -------------------------------------------------------------------------------------
    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                now, deadlines = time.monotonic(), []
                if self._phase is not None and self._phase is not self._overrun:
                    deadlines.append(self._phase[1] + self._phase[2])
                if self._term_at is not None:
                    deadlines.append(self._term_at + self.grace_s)
                if deadlines and min(deadlines) <= now:
                    self._expired(now)
                    continue
                self._cond.wait(min(deadlines) - now if deadlines else None)

    def _expired(self, now: float) -> None:
        """A phase ran past its limit (dump once), or SIGTERM's grace ran out (dump and exit)."""
        waits = where(thread_frames(self._owner))
        if self._term_at is not None and now >= self._term_at + self.grace_s:
            line = (
                f"rank {self.rank}: SIGTERM {self.grace_s:g} s ago and {self.label} has not reached "
                f"the ranks' agreed stop (it waits in {waits}): exiting {TERM_EXIT} without a "
                f"checkpoint; every thread's stack in {self.path}"
            )
            dump_stacks(self.path, line)
            print(f"error: {line}", file=sys.stderr, flush=True)
            with PUBLISH_LOCK:  # never in the middle of a checkpoint's publish
                os._exit(TERM_EXIT)
        assert self._phase is not None
        label, start, limit = self._overrun = self._phase
        line = (
            f"rank {self.rank}: {label} has run {now - start:.1f} s, past the collective timeout "
            f"({limit:g} s); it waits in {waits}"
        )
        dump_stacks(self.path, line)
        print(f"{line}; every thread's stack in {self.path}", file=sys.stderr, flush=True)
