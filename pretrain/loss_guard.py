"""The checks a step's loss and gradient norm pass before the optimizer updates the weights.

- A non-finite loss or gradient norm skips the update (the recipe's rule); after
  ``train.max_skipped_steps`` such steps in a row the run stops with ``NonFiniteError`` (0: at the
  first one).
- A loss spike: with ``train.loss_spike_factor = k > 0``, a loss above k x the median of the last
  ``train.loss_spike_window`` finite losses warns (``train.loss_spike_action: warn``, the record
  gets ``loss_spike: true``) or stops the run before the update (``stop``), so the last
  checkpoint stays the last good one.

The loss and the gradient norm are the same on every rank (all-reduced), so every rank reaches the
same verdict at the same step and stops together.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

SPIKE_ACTIONS = ("warn", "stop")


class TrainingStopped(RuntimeError):
    """The run stopped before an update; nothing of this step is applied or published."""


class NonFiniteError(TrainingStopped):
    """Too many steps in a row had a non-finite loss or gradient norm."""


class LossSpikeError(TrainingStopped):
    """The loss jumped above the configured multiple of its running median."""


class LossGuard:
    """Judges each step's (loss, gradient norm) before the update: ``"skip"`` (non-finite),
    ``"spike"`` (a warned spike), or None (apply it); raises when the run must stop."""

    def __init__(
        self,
        max_skipped: int = 20,
        spike_factor: float = 0.0,
        spike_window: int = 100,
        spike_action: str = "warn",
    ) -> None:
        self.max_skipped, self.spike_factor = max_skipped, spike_factor
        self.spike_action = spike_action
        self.history: deque[float] = deque(maxlen=max(1, spike_window))
        self.in_a_row = 0

    def check(self, step: int, loss: float, grad_norm: float) -> str | None:
        """The verdict on step ``step``; NonFiniteError / LossSpikeError when the run stops."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.in_a_row += 1
            if self.in_a_row > self.max_skipped:
                raise NonFiniteError(
                    f"step {step}: loss {loss}, gradient norm {grad_norm}: {self.in_a_row} "
                    f"non-finite step(s) in a row (train.max_skipped_steps = {self.max_skipped}); "
                    "stopped before the update, nothing of it published; lower train.lr or "
                    "check the data"
                )
            return "skip"
        self.in_a_row = 0
        verdict = self._spike(step, loss)
        self.history.append(loss)
        return verdict

    def _spike(self, step: int, loss: float) -> str | None:
        """``"spike"`` when the loss is above k x the running median of a full window."""
        if self.spike_factor <= 0 or len(self.history) < (self.history.maxlen or 1):
            return None
        median = statistics.median(self.history)
        if loss <= self.spike_factor * median:
            return None
        if self.spike_action == "stop":
            raise LossSpikeError(
                f"step {step}: loss {loss:.4g} is above {self.spike_factor:g} x the running "
                f"median {median:.4g} of the last {len(self.history)} steps "
                "(train.loss_spike_factor); stopped before the update, the last checkpoint is "
                "the last good one"
            )
        return "spike"
