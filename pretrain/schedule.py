"""The learning-rate schedule: linear warmup, constant, optional linear cooldown; set on EVERY group.

(The public training code let the warmup reach only some parameter groups on some ranks; here one
function computes the factor from the step alone and writes it into every group on every rank.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Schedule:
    """lr(step) = peak · factor(step); step counts optimizer steps from 0."""

    peak_lr: float
    warmup_steps: int = 0
    total_steps: int = 0
    cooldown_steps: int = 0
    min_lr_ratio: float = 0.0

    def factor(self, step: int) -> float:
        """Warmup (step+1)/warmup, then 1, then a linear decay to min_lr_ratio over the last steps."""
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.cooldown_steps > 0 and self.total_steps > 0:
            start = self.total_steps - self.cooldown_steps
            if step >= start:
                done = min(1.0, (step - start + 1) / self.cooldown_steps)
                return 1.0 - (1.0 - self.min_lr_ratio) * done
        return 1.0

    def lr(self, step: int) -> float:
        return self.peak_lr * self.factor(step)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Write lr(step) and the peak into every param group; return the lr."""
        lr = self.lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
            group["peak_lr"] = self.peak_lr
        return lr
