"""The command line's estimate and progress for long work: a time from the cost model and this
machine's measured ``F.linear`` speed, and a line on stderr every few seconds while decoding."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

LONG_S = 10.0  # work estimated (or running) longer than this shows an estimate and progress
PROGRESS_EVERY_S = 10.0  # seconds between progress lines
MIN_FLOPS = 1e9  # below this the work is short on any machine: no speed probe is run


@dataclass(frozen=True)
class Estimate:
    """The estimated seconds of one generation and what it rests on."""

    seconds: float
    flops: float
    gflops: float  # the measured F.linear speed of the decode products, GFLOP/s

    def describe(self, tokens: int, steps: int) -> str:
        return (
            f"≈ {self.seconds:.0f} s for {tokens} tokens × {steps} iterations "
            f"({self.flops / 1e9:.3g} GFLOP at a measured {self.gflops:.3g} GFLOP/s)"
        )


def estimate(model, prompt_tokens: int, new_tokens: int, steps: int) -> Estimate | None:
    """The time of a prefill over ``prompt_tokens`` and ``new_tokens`` decoded tokens at ``steps``
    iterations each; None when the work is too small to be worth a speed probe."""
    from .speed import call_overhead, linear_speed

    cost = model.config.cost
    prefill = cost.forward_flops(prompt_tokens, steps, head_tokens=1)
    context = prompt_tokens + new_tokens // 2
    decode = max(new_tokens - 1, 0) * cost.forward_flops(1, steps, context=context)
    if prefill + decode < MIN_FLOPS:
        return None
    fast = linear_speed(model, rows=prompt_tokens).flops_per_second
    slow = linear_speed(model, rows=1).flops_per_second
    calls = cost.layer_calls(steps) * max(new_tokens, 1)
    overhead = call_overhead(str(model.device), model.dtype).seconds * calls
    seconds = prefill / fast + decode / slow + overhead
    return Estimate(seconds, prefill + decode, slow / 1e9)


class Ticker:
    """Progress on ``err`` from a daemon thread: the estimate once the work has run ``first``
    seconds (when it is over LONG_S; work that fails at once prints no estimate), then "[elapsed s
    of ≈ N s] done/total tokens, about M s left" every ``every`` seconds."""

    def __init__(
        self,
        err: TextIO,
        total: int,
        done: Callable[[], int],
        guess: Estimate | None,
        headline: str = "",
        every: float | None = None,
        first: float = 1.0,
    ) -> None:
        self.err, self.total, self.done, self.guess = err, total, done, guess
        self.headline, self.first = headline, first
        self.every = PROGRESS_EVERY_S if every is None else every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cli-progress")

    def __enter__(self) -> Ticker:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def line(self, elapsed: float) -> str:
        """The progress line after ``elapsed`` seconds."""
        done = min(self.done(), self.total)
        of = f" of ≈ {self.guess.seconds:.0f} s" if self.guess is not None else ""
        text = f"[{elapsed:.0f} s{of}] {done}/{self.total} tokens"
        if done > 0:
            text += f", about {elapsed / done * (self.total - done):.0f} s left"
        elif self.guess is not None and elapsed < self.guess.seconds:
            text += f", about {self.guess.seconds - elapsed:.0f} s left by the estimate"
        elif self.guess is not None:
            text += ", past the estimate"
        return text

    def _run(self) -> None:
        if self._stop.wait(self.first):
            return
        if self.guess is not None and self.guess.seconds > LONG_S:
            self.err.write(f"estimate: {self.headline}\n")
            self.err.flush()
        while not self._stop.wait(self.every):
            self.err.write("\n" + self.line(time.perf_counter() - self._t0) + "\n")
            self.err.flush()
