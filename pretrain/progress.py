"""Progress for long work: a tqdm bar on a terminal, periodic plain log lines otherwise.

A bar redrawn many times a second turns a SLURM log (stdout is a file there) into megabytes of
carriage returns; :func:`progress_bar` returns a tqdm bar when stdout is a terminal and a
:class:`LogProgress` that prints one line every ``every_s`` seconds otherwise. Both offer the calls the
trainer and the data preparation use: ``update``, ``set_postfix``, ``write`` and ``close``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

DEFAULT_EVERY_S = 30.0


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class LogProgress:
    """Progress as plain lines (``desc 120/800 (15%) 2.31 it/s elapsed 00:52 eta 04:54 | k=v``).

    A line is printed at the first update, then at most once every ``every_s`` seconds, and at
    ``close``. When ``set_postfix`` follows ``update`` (the trainer's pattern), the line waits for
    the postfix so it shows the numbers of the step it counts.
    """

    def __init__(
        self,
        total: int | None = None,
        initial: int = 0,
        desc: str = "",
        unit: str = "it",
        every_s: float = DEFAULT_EVERY_S,
        stream: IO[str] | None = None,
        disable: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.every_s = every_s
        self.stream = stream
        self.disable = disable
        self.clock = clock
        self.start = clock()
        self.start_n = initial
        self.last_logged: float | None = None
        self.logged_n = initial
        self.postfix: dict[str, Any] | None = None
        self.pending = False

    def _out(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stdout

    def line(self) -> str:
        """The current progress line."""
        elapsed = self.clock() - self.start
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        parts = [f"{self.desc} {count}".strip()]
        if self.total:
            parts.append(f"({100 * self.n / self.total:.0f}%)")
        parts.append(f"{rate:.3g} {self.unit}/s elapsed {_duration(elapsed)}")
        if self.total and rate > 0:
            parts.append(f"eta {_duration((self.total - self.n) / rate)}")
        text = " ".join(parts)
        if self.postfix:
            text += " | " + " ".join(f"{k}={v}" for k, v in self.postfix.items())
        return text

    def _emit(self) -> None:
        self.pending = False
        self.last_logged = self.clock()
        self.logged_n = self.n
        if not self.disable:
            print(self.line(), file=self._out(), flush=True)

    def _due(self) -> bool:
        return self.last_logged is None or self.clock() - self.last_logged >= self.every_s

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.pending or self._due():
            if self.postfix is None:
                self._emit()
            else:
                self.pending = True

    def set_postfix(self, **values: Any) -> None:
        self.postfix = {k: v for k, v in values.items()}
        if self.pending:
            self._emit()

    def write(self, message: str) -> None:
        if not self.disable:
            print(message, file=self._out(), flush=True)

    def close(self) -> None:
        if self.pending or self.n != self.logged_n:
            self._emit()


def progress_bar(
    total: int | None = None,
    initial: int = 0,
    desc: str = "",
    unit: str = "it",
    disable: bool = False,
    tty: bool | None = None,
    every_s: float = DEFAULT_EVERY_S,
) -> Any:
    """A tqdm bar when stdout is a terminal (``tty=None`` asks stdout), else a :class:`LogProgress`."""
    if tty is None:
        tty = sys.stdout.isatty()
    if tty:
        from tqdm import tqdm

        return tqdm(
            total=total, initial=initial, desc=desc, unit=unit, disable=disable, dynamic_ncols=True
        )
    return LogProgress(total, initial, desc, unit, every_s=every_s, disable=disable)
