"""UMAP fits in a child process that Stop can end.

umap-learn reports no progress and cannot be interrupted inside a fit, so the app runs each fit in
one child process (``python -m apps.umap_worker``), kept between fits so that umap's import and
numba's compilation are paid once. The app waits for the answer in short slices, ticking its bar
between them: Stop (or a closed browser session) raises at a tick, and the child is then killed,
which frees its CPU at once; the next fit starts a new one. Requests and answers are pickles on
the child's stdin and stdout (its prints go to stderr).
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Seconds between two ticks while a fit runs (each one a point where Stop acts).
POLL_S = 0.25


class WorkerError(RuntimeError):
    """The UMAP child process failed or ended without an answer."""


class UmapWorker:
    """The one UMAP child process of this server, started on the first fit."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.fitted: set[str] = set()  # request kinds the running child has compiled for

    def fit(self, request: tuple[str, Any], tick: Callable[[], None]) -> Any:
        """The answer to ``request`` ("umap", states) or ("aligned", trajectories); ``tick()`` is
        called every POLL_S seconds while waiting (a raise there kills the child)."""
        while not self._lock.acquire(timeout=POLL_S):
            tick()  # another session's fit runs: wait, stoppable
        try:
            return self._ask(request, tick)
        finally:
            self._lock.release()

    def _ask(self, request: tuple[str, Any], tick: Callable[[], None]) -> Any:
        proc = self._running()
        answered = False
        try:
            pickle.dump(request, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.flush()
            while not select.select([proc.stdout], [], [], POLL_S)[0]:
                if proc.poll() is not None:
                    break
                tick()
            try:
                status, value = pickle.load(proc.stdout)
            except (EOFError, pickle.UnpicklingError) as exc:
                raise WorkerError(f"the UMAP process ended (exit code {proc.poll()})") from exc
            answered = True
        finally:
            if not answered:
                self.stop()
        if status != "ok":
            raise WorkerError(f"UMAP failed in its process: {value}")
        self.fitted.add(request[0])
        return value

    def _running(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self.fitted = set()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "apps.umap_worker"], cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )  # fmt: skip
        return self._proc

    def stop(self) -> None:
        """Kill the child (its fit, if one runs, ends with it)."""
        proc, self._proc, self.fitted = self._proc, None, set()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid


WORKER = UmapWorker()


def _answer(request: tuple[str, Any]) -> Any:
    """What a request asks for: UMAP coordinates, or aligned UMAP embeddings."""
    kind, data = request
    if kind not in ("umap", "aligned"):
        raise ValueError(f"unknown request {kind!r}: 'umap' or 'aligned'")
    import workbench

    if kind == "umap":
        return workbench.project(data, "umap", n_components=2)[0]
    return workbench.aligned_umap(data)[0]


def serve() -> None:
    """The child's loop: one answer per request until stdin closes."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints of the libraries go to stderr, not into the answers
    requests = sys.stdin.buffer
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = ("ok", _answer(request))
        except Exception as exc:  # noqa: BLE001 - sent back and raised in the app as one line
            reply = ("error", f"{type(exc).__name__}: {exc}")
        pickle.dump(reply, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


if __name__ == "__main__":
    serve()
