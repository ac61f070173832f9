"""The rotation fit behind the orbit test of `workbench.dynamics`, batched over tokens.

For each token, the tail's top-k PC scores y_t (centred, shape (W + 1, k)) are fitted by one
sinusoid y_t ≈ c + a cos ωt + b sin ωt: ω maximises the explained variance (a spectral grid over
(0, π], zoomed and refined by a parabolic vertex), backfitted against the second strongest sinusoid;
a and b span the rotation plane. Every array here has a leading token axis T.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .dynamics_features import row_dot

_TINY = 1e-30


@dataclass(frozen=True)
class RotationFit:
    """Per-token results (arrays of shape (T,) unless stated).

    `omega` rad/step; `share` the fraction of the tail's total variance the fit explains; `aspect`
    the ellipse's minor/major axis ratio; `angle_speed` the mean per-step advance of the angle in
    the fitted ellipse's own coordinates; `consistency` the fraction of steps advancing forward, by
    less than 3ω; `radial_trend` the per-step growth ratio of the radius in those coordinates (1 for
    a steady orbit, q for a spiral converging as q^t); `axes` (T, k, 2) the ellipse axes a, b in PC
    coordinates (see `plane_bases`); `moving` whether the tail moves at all (tokens that do not
    get NaN ω).
    """

    omega: np.ndarray
    share: np.ndarray
    angle_speed: np.ndarray
    consistency: np.ndarray
    radial_trend: np.ndarray
    aspect: np.ndarray
    axes: np.ndarray
    moving: np.ndarray


def _times(n: int) -> np.ndarray:
    return np.arange(n, dtype=float) - (n - 1) / 2


def _basis(omegas: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
    """cos ωt and sin ωt centred over t (..., m, n) and their Gram entries cc, ss, cs (..., m)."""
    phase = omegas[..., None] * t
    c, s = np.cos(phase), np.sin(phase)
    c -= c.mean(axis=-1, keepdims=True)
    s -= s.mean(axis=-1, keepdims=True)
    return c, s, np.sum(c * c, -1), np.sum(s * s, -1), np.sum(c * s, -1)


@lru_cache(maxsize=16)
def _grid(n: int, oversample: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The frequency grid over (0, π] for windows of n points and its basis (cached per n)."""
    step = np.pi / (oversample * n)
    omegas = np.arange(step, np.pi + step / 2, step)
    basis = _basis(omegas, _times(n))
    for array in (omegas, *basis):
        array.setflags(write=False)  # shared by every caller of the cache
    return omegas, basis


def _share(basis: tuple[np.ndarray, ...], y: np.ndarray) -> np.ndarray:
    """Fraction of ‖y‖² (y centred, (T, n, k)) explained by a cos ωt + b sin ωt, shape (T, m).

    Closed form: with cos and sin centred (the mean is fitted too) the explained part is
    [C·y, S·y] G⁻¹ [C·y, S·y]ᵀ summed over columns, G their 2 × 2 Gram matrix; where sin vanishes
    (ω = π) only cos is used.
    """
    c, s, gcc, gss, gcs = basis
    bc, bs = c @ y, s @ y
    pcc, pss, pcs = np.sum(bc * bc, -1), np.sum(bs * bs, -1), np.sum(bc * bs, -1)
    det = gcc * gss - gcs**2
    ok = det > 1e-10 * np.maximum(gcc * gss, _TINY)
    num = gss * pcc - 2 * gcs * pcs + gcc * pss
    both = np.divide(num, det, out=np.zeros(np.broadcast(num, det).shape), where=ok)
    cos_only = np.divide(pcc, gcc, out=np.zeros(np.broadcast(pcc, gcc).shape), where=gcc > 0)
    total = np.maximum(np.sum(y**2, axis=(1, 2)), _TINY)
    return np.where(ok, both, cos_only) / total[:, None]


def _refine(y: np.ndarray, lo: np.ndarray, hi: np.ndarray, rounds: int = 2) -> np.ndarray:
    """Per-token ω in [lo, hi] maximising the fit: zoomed 13-point grids + parabolic vertex."""
    t = _times(y.shape[1])
    lo, hi = np.maximum(lo, 1e-6), np.minimum(hi, np.pi)
    for _ in range(rounds):
        spacing = (hi - lo) / 12
        omegas = lo[:, None] + spacing[:, None] * np.arange(13)
        share = _share(_basis(omegas, t), y)
        i = np.clip(np.argmax(share, axis=1), 1, 11)[:, None]
        y0, y1, y2 = (np.take_along_axis(share, i + d, axis=1)[:, 0] for d in (-1, 0, 1))
        curv = y0 - 2 * y1 + y2
        shift = np.divide(0.5 * (y0 - y2), curv, out=np.zeros_like(curv), where=curv < 0)
        best = np.take_along_axis(omegas, i, axis=1)[:, 0] + np.clip(shift, -1, 1) * spacing
        lo, hi = np.maximum(best - spacing, 1e-6), np.minimum(best + spacing, np.pi)
    return best


def best_frequency(y: np.ndarray, oversample: int = 4) -> np.ndarray:
    """Per-token ω in (0, π] maximising the sinusoid fit of centred y (T, n, k)."""
    omegas, basis = _grid(y.shape[1], oversample)
    best = omegas[np.argmax(_share(basis, y), axis=1)]
    step = omegas[1] - omegas[0]
    return _refine(y, best - step, best + step)


def _fit(y: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients (T, 3, k) of y ≈ c + a cos ωt + b sin ωt, and the designs."""
    phase = omega[:, None] * _times(y.shape[1])
    design = np.stack([np.ones_like(phase), np.cos(phase), np.sin(phase)], axis=-1)
    return np.linalg.pinv(design) @ y, design


def _evaluate(y: np.ndarray, omega: np.ndarray) -> np.ndarray:
    coef, design = _fit(y, omega)
    return design @ coef


def dominant_frequency(y: np.ndarray, rounds: int = 3) -> np.ndarray:
    """Per-token ω of the strongest sinusoid in centred y (T, n, k), backfitted.

    Over a window of one or two revolutions a second rotation (a quasi-periodic orbit) leaks into
    the fit of the first and biases ω by a few percent: each round subtracts the best sinusoid of
    the residual and refines ω on the cleaned scores within half a frequency bin.
    """
    omega, half_bin = best_frequency(y), np.pi / y.shape[1]
    for _ in range(rounds):
        resid = y - _evaluate(y, omega)
        cleaned = y - _evaluate(resid, best_frequency(resid))
        omega = _refine(cleaned, omega - half_bin, omega + half_bin)
    return omega


def _angle_stats(coords: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean angle advance per step and the share of steps advancing forward (0 < advance < 3ω),
    per token: a rotation along any convex-ish closed curve advances monotonically, not
    necessarily uniformly (a rounded square speeds up at its corners)."""
    theta = np.arctan2(coords[..., 1], coords[..., 0])
    advance = np.angle(np.exp(1j * np.diff(theta, axis=1)))
    forward = (advance > 0) & (advance < 3 * omega[:, None])
    return np.mean(advance, axis=1), np.mean(forward, axis=1)


def _growth(values: np.ndarray) -> np.ndarray:
    """Per-token exp(slope) of a least-squares line through log(values) (T, n) against t."""
    t = _times(values.shape[1])
    logs = np.log(values + _TINY)
    return np.exp(row_dot(logs - logs.mean(axis=1, keepdims=True), t) / np.sum(t**2))


def rotation_fit(scores: np.ndarray, total_var: np.ndarray) -> RotationFit:
    """Fit each token's dominant rotation from its top PC scores (T, n, k) and total variance."""
    y = scores - scores.mean(axis=1, keepdims=True)
    omega = dominant_frequency(y)
    coef, _ = _fit(y, omega)
    centre, axes = coef[:, 0], np.swapaxes(coef[:, 1:], 1, 2)  # (T, k), (T, k, 2)
    explained = _share(_basis(omega[:, None], _times(y.shape[1])), y)[:, 0]
    in_top = np.sum(y**2, axis=(1, 2)) / np.maximum(total_var, _TINY)
    sv = np.linalg.svd(axes, compute_uv=False)
    coords = (y - centre[:, None]) @ np.swapaxes(np.linalg.pinv(axes), 1, 2)
    angle_speed, consistency = _angle_stats(coords, omega)
    moving = (total_var > 0) & np.any(y != 0, axis=(1, 2))
    nan = np.where(moving, 1.0, np.nan)
    return RotationFit(
        omega=omega * nan,
        share=explained * in_top * moving,
        angle_speed=angle_speed * nan,
        consistency=consistency * moving,
        radial_trend=_growth(np.linalg.norm(coords, axis=2)) * nan,
        aspect=np.divide(sv[:, -1], sv[:, 0], out=np.zeros(len(sv)), where=sv[:, 0] > 0),
        axes=axes,
        moving=moving,
    )


def plane_bases(fit: RotationFit, components: np.ndarray) -> np.ndarray:
    """Orthonormal bases (T, 2, h) of span(a, b) in R^h given the PC directions (T, k, h); zero
    for tokens that do not move."""
    plane, _ = np.linalg.qr(np.swapaxes(components, 1, 2) @ fit.axes)
    return np.swapaxes(plane, 1, 2) * fit.moving[:, None, None]
