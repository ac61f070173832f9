"""Training-time depth: the log-normal Poisson sampler and the truncated-backprop split.

τ ~ N(log r̄ − σ²/2, σ), r = Poisson(e^τ) + 1, so E[e^τ] = r̄ and E[r] = r̄ + 1. The generator is seeded
from (seed, step) alone, so every data-parallel rank draws the same depth for a step without talking.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

DEFAULT_SIGMA = 0.5


class Depth(NamedTuple):
    """A sampled total depth split into iterations run without and with gradient."""

    no_grad: int
    grad: int

    @property
    def total(self) -> int:
        return self.no_grad + self.grad


def split_depth(total: int, backprop_depth: int | None) -> Depth:
    """First max(r − k, 0) iterations without gradient, the last min(r, k) with (k=None: all)."""
    if total < 0:
        raise ValueError(f"depth must be >= 0, got {total}")
    if backprop_depth is None:
        return Depth(0, total)
    grad = min(total, max(int(backprop_depth), 0))
    return Depth(total - grad, grad)


def draw_depths(
    mean_recurrence: float, n: int, rng: np.random.Generator, sigma: float = DEFAULT_SIGMA
) -> np.ndarray:
    """n independent total depths r from the log-normal Poisson (int64 array)."""
    mu = math.log(mean_recurrence) - sigma**2 / 2
    tau = rng.normal(mu, sigma, size=n)
    return rng.poisson(np.exp(tau)) + 1


def sample_depth(
    step: int,
    mean_recurrence: float,
    backprop_depth: int | None,
    seed: int = 0,
    sigma: float = DEFAULT_SIGMA,
) -> Depth:
    """The lock-step depth of training step ``step``: the same on every rank for the same (seed, step)."""
    rng = np.random.default_rng([int(seed), int(step)])
    total = int(draw_depths(mean_recurrence, 1, rng, sigma)[0])
    return split_depth(total, backprop_depth)
