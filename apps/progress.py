"""The progress bar every heavy action shows, and the points where Stop can end the action.

Streamlit ends a script run (Stop pressed, a widget changed, the browser session closed) by raising
at the script's next Streamlit call, and only there. A bar update is such a call: an action is
stoppable as often as its bar moves. ``TaskProgress`` moves between the batches an action reports
and, in between, at every core iteration of the model (``watching``), every chunk a module
decodes (``counting_rows``) or every torch call (``ticking``, for work that loads its own models
or differentiates through the core), so no forward pass runs far past a Stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import streamlit as st
import torch
from torch.overrides import TorchFunctionMode

from recurrent_model.hook_names import RESID_POST, STATE

from . import cost


class TaskProgress:
    """The progress bar of one heavy action, with its estimate beside it.

    Each update is a Streamlit call, so Stop (or a changed widget, or a closed session) ends the
    action at the next update: workbench functions call it between batches, and ``watching``
    between the model's iterations. Created inside a cached function, the bar is replayed and
    emptied on a cache hit; ``elapsed`` is set only when the action ran to its end, and then
    calibrates the next estimate of the same action.
    """

    def __init__(
        self,
        what: str,
        unit: str,
        guess: cost.CostEstimate | cost.TimeEstimate,
        min_interval: float = 0.25,
    ) -> None:
        self.what, self.unit, self.guess, self.min_interval = what, unit, guess, min_interval
        self.elapsed: float | None = None
        self.updates = 0
        self.done, self.total = 0, 0
        self.phase, self.span = "", (0.0, 1.0)
        self._thread: int | None = None

    def start(self) -> None:
        self._bar = st.progress(0.0, text=f"{self.what}: {self.guess.describe()}")
        self._t0 = self._last = time.perf_counter()
        self._thread = threading.get_ident()

    def __call__(self, done: int, total: int) -> None:
        """``done`` of ``total`` units: the bar moves (a few times a second at most)."""
        self.done, self.total = done, total
        self._show(force=done >= total)

    def tick(self) -> None:
        """A stop point that moves nothing but the time shown (a few times a second at most)."""
        self._show(force=False)

    def tick_clock(self) -> None:
        """``tick`` for work that reports no progress: the bar follows the estimate's seconds."""
        total = max(1, round(self.guess.seconds))
        self.done = min(int(time.perf_counter() - self._t0), total)
        self.total = total
        self.tick()

    def set_phase(self, phase: str, span: tuple[float, float], total: int) -> None:
        """Name the part of the action that runs now and the share of the bar it fills
        (``span``, from 0 to 1); its ``total`` units are counted from 0 again."""
        self.phase, self.span, self.done, self.total = phase, span, 0, total
        self._show(force=False)

    def fraction(self, done: int, total: int) -> float:
        """The share of the whole action done: ``done`` of ``total`` units of the phase's span."""
        start, end = self.span
        return start + (end - start) * min(done / max(total, 1), 1.0)

    def _show(self, force: bool) -> None:
        now = time.perf_counter()
        if not force and now - self._last < self.min_interval:
            return  # a few updates a second are enough
        self._last, self.updates = now, self.updates + 1
        fraction = self.fraction(self.done, self.total)
        self._bar.progress(fraction, text=self.text(self.done, self.total, now - self._t0))

    def text(self, done: int, total: int, seconds: float) -> str:
        """Done so far, and the time left: extrapolated from the action's own pace once a part
        is done, from the estimate before."""
        first = f"estimated {self.guess.seconds:.0f} s at the start"
        what = f"{self.what} ({self.phase})" if self.phase else self.what
        fraction = self.fraction(done, total)
        if fraction <= 0:
            return f"{what}: 0/{total} {self.unit} · {seconds:.0f} s of an {first}"
        left = seconds / fraction * (1.0 - fraction)
        return (
            f"{what}: {done}/{total} {self.unit} · {seconds:.0f} s, about {left:.0f} s "
            f"left ({first})"
        )

    def finish(self) -> None:
        """The action ran to its end: its time calibrates the next estimate of the same kind."""
        self.elapsed = time.perf_counter() - self._t0
        self._bar.empty()
        self.guess.done(self.elapsed)

    @contextmanager
    def watching(self, model, per_unit: int = 0, total: int = 0) -> Iterator[None]:
        """Every block call and core iteration of ``model`` in this thread is a stop point (the
        hooks after each sandwich block and on the core's state). With ``per_unit`` the state
        hook's firings (s_0 … s_r of a forward) also count the bar's units: one unit per
        ``per_unit`` firings, of ``total``.

        Firings in other threads (another session running the same model) are not counted."""
        fired = [0]

        def hook(x, point) -> None:
            if threading.get_ident() != self._thread:
                return
            if per_unit and point.name == STATE:
                fired[0] += 1
                self.done, self.total = min(fired[0] // per_unit, total), total
            self.tick()

        names = [STATE, *(n for n in model.hook_names() if n.endswith(RESID_POST))]
        with model.hooks([(name, hook) for name in names]):
            yield

    @contextmanager
    def ticking(self) -> Iterator[None]:
        """Every torch call in this thread is a stop point (torch function modes are per
        thread): for work that loads its own models, such as a checkpoint series."""
        with _Ticks(self):
            yield

    @contextmanager
    def counting_rows(self, modules: Sequence[torch.nn.Module], total: int) -> Iterator[None]:
        """Each call of ``modules`` in this thread moves the bar by its output's first dimension
        (the states of a chunk), of ``total``: a stop point per chunk."""
        rows = [0]

        def hook(_module, _args, out) -> None:
            if threading.get_ident() != self._thread:
                return
            rows[0] += int(out.shape[0])
            self.done, self.total = min(rows[0], total), total
            self.tick()

        handles = [m.register_forward_hook(hook) for m in modules]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


class CollectProgress(TaskProgress):
    """The progress bar of one collection, per run and iteration (see TaskProgress)."""

    def __init__(self, what: str, guess: cost.CostEstimate, min_interval: float = 0.25) -> None:
        super().__init__(f"Collecting {what}", "run-iterations", guess, min_interval)


class _Ticks(TorchFunctionMode):
    """Ticks a TaskProgress on every torch function call (the tick itself is a clock read
    unless a bar update is due)."""

    def __init__(self, progress: TaskProgress) -> None:
        super().__init__()
        self.progress = progress

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.progress.tick()
        return func(*args, **(kwargs or {}))
