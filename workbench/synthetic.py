"""Synthetic latent trajectories with known dynamics, to validate `classify_dynamics`.

Every trajectory lives in R^h around a random centre c with ‖c‖ = sqrt(h) (RMS 1, like ln_f
output); sizes below (radii, speeds) are fractions of ‖c‖. Isotropic Gaussian noise of
per-coordinate std `noise` × rms(c) (levels 0, 1e-3, 3e-3, 1e-2) is added, then each state is
RMS-normalised (x / rms(x)), as ln_f does without its weight.

Kinds and subtypes (labels `kind`, `subtype`, and `period` = steps per revolution of the dominant
rotation):
  orbit:       circle, ellipse, quasi (two planes, the second with 20–60 % of the amplitude);
               radius 5–30 %, period 4–60 steps; long (a circle whose period is 55–75 % of the
               run, more than the default tail of half the run holds); flip (period 2: two states
               alternating, angular speed π); all preceded by a converging transient.
  slider:      line, curved (direction bends up to ~50°), wobble (line + a small rotation);
               speed 0.3–0.8 % per step.
  fixed_point: fast (contraction 0.5–0.8 per step), slow (0.88–0.95), spiral (damped rotation),
               early (converged early with a decaying oscillation: a fast transient (0.5–0.7)
               and a period-2 flip of 1–5 % decaying by 0.88–0.95 per step, its amplitude
               wobbling by a factor e^(0.3 ε) from step to step, so the step norms fit no clean
               line; the tail still alternates, but dies away).
  other:       walk (Gaussian random walk, steps 0.5–2 %).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

SUBTYPES: dict[str, tuple[str, ...]] = {
    "orbit": ("circle", "ellipse", "quasi", "long", "flip"),
    "slider": ("line", "curved", "wobble"),
    "fixed_point": ("fast", "slow", "spiral", "early"),
    "other": ("walk",),
}
NOISE_LEVELS: tuple[float, ...] = (0.0, 1e-3, 3e-3, 1e-2)
MIN_PERIOD, MAX_PERIOD = 4.0, 60.0
OWN_PERIODS = ("long", "flip")  # orbit subtypes with their own period range


@dataclass(frozen=True)
class SyntheticSet:
    """States (steps + 1, T, h) of T synthetic tokens and their labels (one row per token)."""

    states: np.ndarray
    labels: pd.DataFrame


def rms_normalise(x: np.ndarray) -> np.ndarray:
    """x / rms(x) along the last axis (ln_f without weight); zero vectors stay zero."""
    rms = np.sqrt(np.mean(x**2, axis=-1, keepdims=True))
    return np.divide(x, rms, out=np.zeros_like(x), where=rms > 0)


def _unit(rng: np.random.Generator, h: int, n: int) -> np.ndarray:
    """n orthonormal random directions of R^h as rows (n, h)."""
    q, _ = np.linalg.qr(rng.standard_normal((h, n)))
    return q.T


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _rotation(t: np.ndarray, period: float, phase: float) -> tuple[np.ndarray, np.ndarray]:
    angle = 2 * np.pi * t / period + phase
    return np.cos(angle), np.sin(angle)


def _transient(t: np.ndarray, rng: np.random.Generator, h: int, scale: float) -> np.ndarray:
    """A converging transient A q^t d with q in [0.6, 0.85] (gone by the second half)."""
    q = rng.uniform(0.6, 0.85)
    d = _unit(rng, h, 1)[0]
    return scale * rng.uniform(0.3, 1.0) * np.outer(q**t, d)


def _orbit(sub: str, t: np.ndarray, rng: np.random.Generator, h: int, period: float):
    norm = np.sqrt(h)
    radius = rng.uniform(0.05, 0.3) * norm
    u, v, u2, v2 = _unit(rng, h, 4)
    cos, sin = _rotation(t, period, rng.uniform(0, 2 * np.pi))
    aspect = rng.uniform(0.3, 0.8) if sub == "ellipse" else 1.0
    x = radius * (np.outer(cos, u) + aspect * np.outer(sin, v))
    if sub == "quasi":
        period2 = _log_uniform(rng, MIN_PERIOD, MAX_PERIOD)
        while abs(period2 / period - 1) < 0.2:
            period2 = _log_uniform(rng, MIN_PERIOD, MAX_PERIOD)
        cos2, sin2 = _rotation(t, period2, rng.uniform(0, 2 * np.pi))
        x += rng.uniform(0.2, 0.6) * radius * (np.outer(cos2, u2) + np.outer(sin2, v2))
    return x + _transient(t, rng, h, norm), period


def _slider(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    norm, steps = np.sqrt(h), t[-1]
    speed = rng.uniform(0.003, 0.008) * norm
    d1, d2, d3, d4 = _unit(rng, h, 4)
    x = speed * np.outer(t, d1)
    if sub == "curved":  # the velocity turns by up to ~50 degrees over the run
        bend = rng.uniform(0.3, 0.6)
        x += speed * bend * np.outer(t**2 / steps, d2)
    if sub == "wobble":  # a rotation whose speed is 20-50 % of the drift speed
        period = rng.uniform(6, 30)
        amp = rng.uniform(0.2, 0.5) * speed * period / (2 * np.pi)
        cos, sin = _rotation(t, period, rng.uniform(0, 2 * np.pi))
        x += amp * (np.outer(cos, d3) + np.outer(sin, d4))
    return x + _transient(t, rng, h, 0.3 * norm), np.nan


def _fixed(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    norm = np.sqrt(h)
    q = rng.uniform(0.5, 0.8) if sub == "fast" else rng.uniform(0.88, 0.95)
    amp = rng.uniform(0.2, 1.0) * norm
    u, v = _unit(rng, h, 2)
    if sub == "spiral":
        cos, sin = _rotation(t, _log_uniform(rng, MIN_PERIOD, MAX_PERIOD), 0.0)
        return amp * (q**t)[:, None] * (np.outer(cos, u) + np.outer(sin, v)), np.nan
    if sub == "early":  # fast transient, then a slowly dying flip (no step-norm log-linear fit)
        wobble = np.exp(0.3 * rng.standard_normal(len(t)))
        flip = rng.uniform(0.01, 0.05) * norm * wobble * (-rng.uniform(0.88, 0.95)) ** t
        return amp * np.outer(rng.uniform(0.5, 0.7) ** t, u) + np.outer(flip, v), np.nan
    return amp * np.outer(q**t, u), np.nan


def _walk(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    step = rng.uniform(0.005, 0.02)  # per-coordinate std = step norm / sqrt(h)
    steps = rng.normal(0.0, step, size=(len(t), h))
    steps[0] = 0.0
    return np.cumsum(steps, axis=0), np.nan


_MAKERS: dict[str, Callable] = {"slider": _slider, "fixed_point": _fixed, "other": _walk}


def max_period(steps: int) -> float:
    """Longest orbit period generated for a run: min(60, steps // 2), so that the default tail
    (half of the run) holds at least one revolution."""
    return float(min(MAX_PERIOD, steps // 2))


def subtype_period(subtype: str, steps: int, rng: np.random.Generator) -> float | None:
    """The period of the orbit subtypes that have their own range (long, flip), else None."""
    if subtype == "flip":
        return 2.0
    if subtype == "long":
        return float(rng.uniform(0.55, 0.75) * steps)
    return None


def make_trajectory(
    kind: str,
    subtype: str,
    steps: int,
    h: int,
    noise: float,
    rng: np.random.Generator,
    period: float | None = None,
) -> tuple[np.ndarray, float]:
    """One labelled trajectory (steps + 1, h), RMS-normalised, and its period (NaN unless orbit).

    An orbit's `period` defaults to a log-uniform draw in [4, max_period(steps)] (long: 55–75 %
    of the run; flip: 2).
    """
    if subtype not in SUBTYPES[kind]:
        raise ValueError(f"unknown subtype {subtype!r} for kind {kind!r}")
    t = np.arange(steps + 1, dtype=float)
    if kind == "orbit":
        if period is None:
            period = subtype_period(subtype, steps, rng)
        if period is None:
            period = _log_uniform(rng, MIN_PERIOD, max_period(steps))
        x, period = _orbit(subtype, t, rng, h, period)
    else:
        x, period = _MAKERS[kind](subtype, t, rng, h)
    centre = rng.standard_normal(h)
    x = x + centre * np.sqrt(h) / np.linalg.norm(centre)
    x = x + noise * rng.standard_normal(x.shape)  # per-coordinate std = noise * rms(c)
    return rms_normalise(x), period


def make_set(cases: list[tuple], steps: int, h: int, rng: np.random.Generator) -> SyntheticSet:
    """Trajectories for (kind, subtype, noise) or (kind, subtype, noise, period) cases, stacked as
    (steps + 1, T, h)."""
    trajs, rows = [], []
    for token, (kind, subtype, noise, *period) in enumerate(cases):
        x, period = make_trajectory(kind, subtype, steps, h, noise, rng, *period)
        trajs.append(x)
        rows.append(dict(token=token, kind=kind, subtype=subtype, period=period, noise=noise))
    labels = pd.DataFrame(rows).assign(steps=steps, h=h)
    return SyntheticSet(states=np.stack(trajs, axis=1), labels=labels)


def _stratified_periods(n: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """n periods covering [4, max_period(steps)] evenly in log scale (one per stratum), shuffled."""
    edges = np.linspace(np.log(MIN_PERIOD), np.log(max_period(steps)), n + 1)
    return rng.permutation(np.exp(rng.uniform(edges[:-1], edges[1:])))


def make_benchmark(
    seed: int = 0,
    repeats: int = 2,
    sizes: tuple[tuple[int, int], ...] = ((64, 64), (96, 128), (128, 256)),
    noise_levels: tuple[float, ...] = NOISE_LEVELS,
) -> list[SyntheticSet]:
    """The benchmark: for each (steps, h) size, `repeats` tokens per subtype and noise level.

    The circle, ellipse and quasi orbits of each size get stratified periods spanning
    [4, max_period(steps)]; long and flip orbits draw their own.
    """
    rng = np.random.default_rng(seed)
    cases = [
        (kind, sub, noise)
        for kind, subs in SUBTYPES.items()
        for sub in subs
        for noise in noise_levels
        for _ in range(repeats)
    ]
    sets = []
    for steps, h in sizes:
        spread = [c[0] == "orbit" and c[1] not in OWN_PERIODS for c in cases]
        periods = iter(_stratified_periods(sum(spread), steps, rng))
        sized = [c + (next(periods),) if s else c for c, s in zip(cases, spread, strict=True)]
        sets.append(make_set(sized, steps, h, rng))
    return sets
