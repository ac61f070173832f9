"""A second, independent family of synthetic trajectories: the held-out check of `classify_dynamics`.

`workbench.synthetic` is the family the classifier's rules and thresholds were chosen on. This one
was written before the transient-window change and is built differently everywhere, and nothing in
the classifier was tuned on it:

  states:   ln_f with a random positive weight (x / rms(x) · w, w log-normal), sizes 48, 80, 160
            and runs of 48, 64 and 100 steps;
  noise:    Student-t (3 degrees of freedom) or anisotropic Gaussian (per-coordinate std varying
            tenfold), at 0, 2e-3 and 5e-3 of the RMS state;
  orbit:    torus (two rotations in two planes, the second at 30–60 % of the amplitude), warped
            (non-uniform angular speed θ = ωt + β sin ωt, β ≤ 0.5), skew (an ellipse on two
            non-orthogonal axes), long (a period of 55–75 % of the run), flip (period 2: two states
            alternating); transients spiral in from outside the orbit (in-plane) and decay off-plane;
  slider:   geodesic (drift along a great circle of the state sphere), accelerating (speed rising
            up to threefold over the run);
  fixed_point: damped_flip (c + A (−q)^t u), power (c + A / (1 + t)² u), two_rate (two
            exponentials of different rates in different directions);
  other:    levy (random walk with Student-t steps), smooth_walk (random walk with AR(1)
            increments, ρ = 0.5).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .synthetic import SyntheticSet

HOLDOUT_SUBTYPES: dict[str, tuple[str, ...]] = {
    "orbit": ("torus", "warped", "skew", "long", "flip"),
    "slider": ("geodesic", "accelerating"),
    "fixed_point": ("damped_flip", "power", "two_rate"),
    "other": ("levy", "smooth_walk"),
}
HOLDOUT_NOISE: tuple[float, ...] = (0.0, 2e-3, 5e-3)
HOLDOUT_SIZES: tuple[tuple[int, int], ...] = ((48, 48), (64, 80), (100, 160))


def _orthonormal(rng: np.random.Generator, h: int, n: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((h, n)))
    return q.T


def _orbit_period(sub: str, steps: int, rng: np.random.Generator) -> float:
    if sub == "flip":
        return 2.0
    if sub == "long":
        return rng.uniform(0.55, 0.75) * steps
    return float(np.exp(rng.uniform(np.log(3.0), np.log(0.45 * steps))))


def _holdout_orbit(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    steps, norm = len(t) - 1, np.sqrt(h)
    period = _orbit_period(sub, steps, rng)
    omega, phase = 2 * np.pi / period, rng.uniform(0, 2 * np.pi)
    radius = rng.uniform(0.06, 0.25) * norm
    u, v, u2, v2, d = _orthonormal(rng, h, 5)
    tau = rng.uniform(1.5, 5.0)
    swell = 1 + rng.uniform(0.5, 2.0) * np.exp(-t / tau)  # spirals in from outside
    if sub == "flip":
        x = radius * np.outer((-1.0) ** t * swell, u)
    else:
        theta = omega * t + phase
        if sub == "warped":
            theta = theta + rng.uniform(0.2, 0.5) * np.sin(omega * t + rng.uniform(0, 6))
        a, b = u, v
        if sub == "skew":
            angle = rng.uniform(np.pi / 6, np.pi / 2)
            b = rng.uniform(0.25, 1.0) * (np.cos(angle) * u + np.sin(angle) * v)
        x = radius * swell[:, None] * (np.outer(np.cos(theta), a) + np.outer(np.sin(theta), b))
        if sub == "torus":
            p2 = period
            while abs(p2 / period - 1) < 0.25:
                p2 = float(np.exp(rng.uniform(np.log(3.0), np.log(0.45 * steps))))
            th2 = 2 * np.pi * t / p2 + rng.uniform(0, 2 * np.pi)
            x += (
                rng.uniform(0.3, 0.6)
                * radius
                * (np.outer(np.cos(th2), u2) + np.outer(np.sin(th2), v2))
            )
    off = rng.uniform(0.2, 1.0) * norm * np.exp(-t / rng.uniform(1.5, 5.0))
    return x + np.outer(off, d), period


def _holdout_slider(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    steps, norm = len(t) - 1, np.sqrt(h)
    e1, e2, d = _orthonormal(rng, h, 3)
    speed = rng.uniform(0.004, 0.01)
    if sub == "geodesic":  # replaces the centre: a great circle through it
        angle = speed * t
        x = norm * (np.outer(np.cos(angle), e1) + np.outer(np.sin(angle), e2))
        return x + np.outer(0.3 * norm * 0.7**t, d), np.nan, True
    gain = rng.uniform(0.0, 1.0)
    x = speed * norm * np.outer(t + gain * t**2 / steps, e1)
    return x + np.outer(0.3 * norm * 0.7**t, d), np.nan, False


def _holdout_fixed(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    norm = np.sqrt(h)
    u, v = _orthonormal(rng, h, 2)
    amp = rng.uniform(0.2, 1.0) * norm
    if sub == "damped_flip":
        return amp * np.outer((-rng.uniform(0.6, 0.9)) ** t, u), np.nan
    if sub == "power":
        return amp * np.outer(1.0 / (1 + t) ** 2, u), np.nan
    q1, q2 = rng.uniform(0.5, 0.7), rng.uniform(0.85, 0.93)
    return amp * (np.outer(q1**t, u) + rng.uniform(0.1, 0.5) * np.outer(q2**t, v)), np.nan


def _holdout_other(sub: str, t: np.ndarray, rng: np.random.Generator, h: int):
    scale = rng.uniform(0.006, 0.02)
    if sub == "levy":
        steps = scale * rng.standard_t(2, size=(len(t), h)) / 1.5
    else:
        white = rng.normal(0.0, scale, size=(len(t), h))
        steps = np.zeros_like(white)
        for i in range(1, len(t)):
            steps[i] = 0.5 * steps[i - 1] + np.sqrt(0.75) * white[i]
    steps[0] = 0.0
    return np.cumsum(steps, axis=0), np.nan


def _noise(rng: np.random.Generator, shape: tuple[int, int], level: float, kind: int) -> np.ndarray:
    if kind == 0:
        return level * rng.standard_t(3, size=shape) / np.sqrt(3.0)
    scales = np.exp(rng.uniform(np.log(0.3), np.log(3.0), size=shape[1]))
    return level * scales * rng.standard_normal(shape)


def holdout_trajectory(
    kind: str, subtype: str, steps: int, h: int, noise: float, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """One held-out trajectory (steps + 1, h) after ln_f with a random weight, and its period."""
    if subtype not in HOLDOUT_SUBTYPES[kind]:
        raise ValueError(f"unknown held-out subtype {subtype!r} for kind {kind!r}")
    t = np.arange(steps + 1, dtype=float)
    centred = True
    if kind == "orbit":
        x, period = _holdout_orbit(subtype, t, rng, h)
    elif kind == "slider":
        x, period, on_sphere = _holdout_slider(subtype, t, rng, h)
        centred = not on_sphere
    elif kind == "fixed_point":
        x, period = _holdout_fixed(subtype, t, rng, h)
    else:
        x, period = _holdout_other(subtype, t, rng, h)
    if centred:
        c = rng.standard_normal(h)
        x = x + c * np.sqrt(h) / np.linalg.norm(c)
    x = x + _noise(rng, x.shape, noise, int(rng.integers(2)))
    rms = np.sqrt(np.mean(x**2, axis=1, keepdims=True))
    weight = np.exp(rng.normal(0.0, 0.3, size=h))
    return x / rms * weight, period


def make_holdout(seed: int = 1000, repeats: int = 2) -> list[SyntheticSet]:
    """The held-out benchmark: per size, `repeats` tokens per subtype and noise level."""
    rng = np.random.default_rng(seed)
    sets = []
    for steps, h in HOLDOUT_SIZES:
        trajs, rows = [], []
        for kind, subs in HOLDOUT_SUBTYPES.items():
            for sub in subs:
                for noise in HOLDOUT_NOISE:
                    for _ in range(repeats):
                        x, period = holdout_trajectory(kind, sub, steps, h, noise, rng)
                        trajs.append(x)
                        rows.append(dict(kind=kind, subtype=sub, period=period, noise=noise))
        labels = pd.DataFrame(rows).assign(steps=steps, h=h)
        labels.insert(0, "token", range(len(labels)))
        sets.append(SyntheticSet(states=np.stack(trajs, axis=1), labels=labels))
    return sets
