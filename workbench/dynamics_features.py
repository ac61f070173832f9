"""Per-token measurements on the tail of one latent trajectory (used by `workbench.dynamics`).

A tail is an array (W + 1, h): the last W steps of one token's states. Every function here is pure
numpy/scipy on one tail; `workbench.dynamics` turns the numbers into a kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

_TINY = 1e-30


def _safe_ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """num / den, 0 where den is 0 (a zero trajectory does not move)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


def tail_pca(tails: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token PCA of tails (T, W + 1, h) through the (W + 1)² Gram matrix (cheap for large h).

    Returns scores (T, W + 1, k), unit components (T, k, h) and total variance (T,); components of
    zero variance are zero.
    """
    centred = tails - tails.mean(axis=1, keepdims=True)
    gram = centred @ np.swapaxes(centred, 1, 2)
    evals, evecs = np.linalg.eigh(gram)
    evals, evecs = np.clip(evals[:, ::-1][:, :k], 0, None), evecs[:, :, ::-1][:, :, :k]
    sd = np.sqrt(evals)
    keep = sd > 1e-9 * np.maximum(sd[:, :1], _TINY)
    scores = evecs * (sd * keep)[:, None, :]
    inv = np.divide(1.0, sd, out=np.zeros_like(sd), where=keep)
    components = np.swapaxes(evecs * inv[:, None, :], 1, 2) @ centred
    return scores, components, np.trace(gram, axis1=1, axis2=2)


def _log_slope(values: np.ndarray) -> tuple[float, float]:
    """Slope and R² of a least-squares line through log(values) against the step index."""
    logs = np.log(values + _TINY)
    t = np.arange(len(logs), dtype=float)
    slope, intercept = np.polyfit(t, logs, 1)
    total = np.sum((logs - logs.mean()) ** 2)
    resid = np.sum((logs - slope * t - intercept) ** 2)
    return float(slope), float(1 - resid / total) if total > 0 else 0.0


def _chunk_motion(points: np.ndarray, steps: np.ndarray, chunks: int) -> tuple[float, ...]:
    """Settling ratio, chunk shrink and chunk contraction from the means of `chunks` equal chunks.

    settling ratio = ‖last chunk mean − the one before‖ / mean step norm over those two chunks:
    about 1/sqrt(L) (L = chunk length) for i.i.d. jitter around a point, about sqrt(2L/3) for a
    random walk and about L for a steady drift. chunk shrink = D_last / D_first, the displacements D
    between successive chunk means, when they shrink monotonically (a geometric approach averaged
    over noise), else 1; chunk contraction = its per-step rate shrink^(1 / (L (chunks − 2))).
    """
    size = max(1, (len(points) - 1) // chunks)
    ends = len(points) - np.arange(chunks, 0, -1) * size
    means = np.stack([points[e : e + size].mean(axis=0) for e in ends])
    disp = np.linalg.norm(np.diff(means, axis=0), axis=1)
    settling = float(_safe_ratio(disp[-1], steps[-2 * size :].mean()))
    if disp[0] <= 0 or np.any(np.diff(disp) >= 0):
        return settling, 1.0, 1.0
    shrink = float(disp[-1] / disp[0])
    return settling, shrink, shrink ** (1 / (size * (chunks - 2)))


def convergence_features(
    tail: np.ndarray, scores: np.ndarray, last: int = 4, chunks: int = 4
) -> dict[str, float]:
    """Step sizes of a tail (W + 1, h) with its top PC scores (W + 1, k).

    `contraction` = exp(slope) of a least-squares line through the log step norms measured in the
    top-3 PC space (where i.i.d. noise is mostly projected out), the ratio of successive steps (< 1
    for geometric convergence), and `contraction_fit` its R². `spread` = RMS distance to the tail
    mean / mean norm; `settling_ratio`, `chunk_shrink` and `chunk_contraction` (see `_chunk_motion`,
    `chunks` chunks) come from the top-3 PC scores too.
    """
    steps = np.linalg.norm(np.diff(tail, axis=0), axis=1)
    norms = np.linalg.norm(tail[1:], axis=1)
    rel = _safe_ratio(steps, norms)
    top = scores[:, :3]
    top_steps = np.linalg.norm(np.diff(top, axis=0), axis=1)
    slope, fit = _log_slope(top_steps)
    spread_sq = np.mean(np.sum((tail - tail.mean(axis=0)) ** 2, axis=1))
    settling, shrink, chunk_contraction = _chunk_motion(top, top_steps, chunks)
    return dict(
        final_step_size=float(rel[-1]),
        tail_relative_step=float(np.median(rel[-last:])),
        contraction=float(np.exp(slope)),
        contraction_fit=fit,
        spread=float(_safe_ratio(np.sqrt(spread_sq), norms.mean())),
        settling_ratio=settling,
        chunk_shrink=shrink,
        chunk_contraction=chunk_contraction,
    )


def drift_features(tail: np.ndarray, scores: np.ndarray, chunks: int = 8) -> dict[str, float]:
    """Directional drift: least-squares velocity, its variance share and coarse straightness.

    `drift_velocity_norm` = ‖β‖ of x_t ≈ x̄ + β (t − t̄) (distance per step); `drift_variance_share` =
    the share of tail variance along β; `straightness` = net displacement / path length, the path
    measured over `chunks` equal chunks so that per-step noise does not inflate it (a random walk
    scores about 1/sqrt(chunks), a straight drift 1).
    """
    n = len(tail)
    t = np.arange(n, dtype=float) - (n - 1) / 2
    centred = tail - tail.mean(axis=0)
    beta = t @ centred / np.sum(t**2)
    speed = float(np.linalg.norm(beta))
    total_var = float(np.sum(centred**2))
    along = centred @ (beta / speed) if speed > 0 else np.zeros(n)
    stride = max(1, (n - 1) // chunks)
    idx = np.unique(np.r_[np.arange(0, n, stride), n - 1])
    path = np.sum(np.linalg.norm(np.diff(tail[idx], axis=0), axis=1))
    net = np.linalg.norm(tail[-1] - tail[0])
    top = scores[idx, :3]
    top_path = np.sum(np.linalg.norm(np.diff(top, axis=0), axis=1))
    return dict(
        pc_straightness=float(_safe_ratio(np.linalg.norm(top[-1] - top[0]), top_path)),
        drift_velocity_norm=speed,
        drift_variance_share=float(_safe_ratio(np.sum(along**2), total_var)),
        straightness=float(_safe_ratio(net, path)),
    )


@dataclass(frozen=True)
class RotationFit:
    """Best single-frequency fit Y_t ≈ c + a cos(ωt) + b sin(ωt) of the tail's top-k PC scores.

    `plane` (2, h) is an orthonormal basis of span(a, b) mapped back to R^h; `share` the fraction of
    the tail's variance the fit explains; `aspect` the ellipse's minor/major axis ratio;
    `angle_speed` the median per-step advance of the angle in the fitted ellipse's own coordinates;
    `consistency` the fraction of steps whose advance is within 50 % of ω; `radial_trend` the
    per-step growth ratio of the radius in those coordinates (1 for a steady orbit, q for a spiral
    converging as q^t).
    """

    omega: float
    share: float
    angle_speed: float
    consistency: float
    radial_trend: float
    aspect: float
    plane: np.ndarray


def _design(omegas: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Stacked design matrices [1, cos ωt, sin ωt] of shape (len(omegas), len(t), 3)."""
    phase = omegas[:, None] * t[None, :]
    return np.stack([np.ones_like(phase), np.cos(phase), np.sin(phase)], axis=-1)


def _centred_basis(omegas: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
    """cos ωt and sin ωt centred over t (m, n), and their Gram entries cc, ss, cs (m,)."""
    phase = np.outer(omegas, t)
    c, s = np.cos(phase), np.sin(phase)
    c -= c.mean(axis=1, keepdims=True)
    s -= s.mean(axis=1, keepdims=True)
    return c, s, np.sum(c * c, 1), np.sum(s * s, 1), np.sum(c * s, 1)


@lru_cache(maxsize=16)
def _grid(n: int, oversample: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The frequency grid over (0, π] for windows of n points, and its centred basis (cached)."""
    step = np.pi / (oversample * n)
    omegas = np.arange(step, np.pi + step / 2, step)
    return omegas, _centred_basis(omegas, np.arange(n, dtype=float) - (n - 1) / 2)


def _share(basis: tuple[np.ndarray, ...], scores: np.ndarray) -> np.ndarray:
    """Fraction of ‖y‖² (y = scores minus their mean) explained by c + a cos ωt + b sin ωt.

    Closed form: with cos and sin centred (the mean is fitted too), the explained part is
    [C·y, S·y] G⁻¹ [C·y, S·y]ᵀ summed over columns, G their 2 × 2 Gram matrix; where sin vanishes
    (ω = π) only cos is used.
    """
    c, s, gcc, gss, gcs = basis
    y = scores - scores.mean(axis=0)
    bc, bs = c @ y, s @ y
    pcc, pss, pcs = np.sum(bc * bc, 1), np.sum(bs * bs, 1), np.sum(bc * bs, 1)
    det = gcc * gss - gcs**2
    ok = det > 1e-10 * np.maximum(gcc * gss, _TINY)
    both = np.divide(gss * pcc - 2 * gcs * pcs + gcc * pss, det, out=np.zeros_like(det), where=ok)
    cos_only = np.divide(pcc, gcc, out=np.zeros_like(gcc), where=gcc > 0)
    return np.where(ok, both, cos_only) / max(float(np.sum(y**2)), _TINY)


def _explained(omegas: np.ndarray, t: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Fraction of the scores' variance explained by the sinusoid at each ω (see `_share`)."""
    return _share(_centred_basis(omegas, t), scores)


def _refine(scores: np.ndarray, t: np.ndarray, lo: float, hi: float, rounds: int = 2) -> float:
    """The ω in [lo, hi] maximising the sinusoid fit of scores: zoomed grids + parabolic vertex."""
    lo, hi = max(lo, 1e-6), min(hi, np.pi)
    for _ in range(rounds):
        omegas = np.linspace(lo, hi, 13)
        share = _explained(omegas, t, scores)
        i = int(np.clip(np.argmax(share), 1, len(omegas) - 2))
        y0, y1, y2 = share[i - 1 : i + 2]
        curv = y0 - 2 * y1 + y2
        shift = 0.5 * (y0 - y2) / curv if curv < 0 else 0.0
        spacing = omegas[1] - omegas[0]
        best = omegas[i] + np.clip(shift, -1, 1) * spacing
        lo, hi = max(best - spacing, 1e-6), min(best + spacing, np.pi)
    return float(best)


def best_frequency(scores: np.ndarray, oversample: int = 4) -> float:
    """The ω in (0, π] maximising the sinusoid fit of scores (W + 1, k): grid, then refined."""
    n = len(scores)
    t = np.arange(n, dtype=float) - (n - 1) / 2
    omegas, basis = _grid(n, oversample)
    best = int(np.argmax(_share(basis, scores)))
    step = omegas[1] - omegas[0]
    return _refine(scores, t, omegas[best] - step, omegas[best] + step)


def _sinusoid(scores: np.ndarray, omega: float) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares centre (k,) and axes (k, 2) of scores ≈ c + a cos ωt + b sin ωt."""
    n = len(scores)
    t = np.arange(n, dtype=float) - (n - 1) / 2
    coef, *_ = np.linalg.lstsq(_design(np.array([omega]), t)[0], scores, rcond=None)
    return coef[0], coef[1:].T


def _evaluate(scores: np.ndarray, omega: float) -> np.ndarray:
    """The least-squares sinusoid c + a cos ωt + b sin ωt fitted to scores, evaluated at each t."""
    n = len(scores)
    design = _design(np.array([omega]), np.arange(n, dtype=float) - (n - 1) / 2)[0]
    coef, *_ = np.linalg.lstsq(design, scores, rcond=None)
    return design @ coef


def dominant_frequency(scores: np.ndarray, rounds: int = 3) -> float:
    """ω of the strongest sinusoid in scores, backfitted against the second strongest.

    Over a window of one or two revolutions a second rotation (a quasi-periodic orbit) leaks into
    the fit of the first and biases ω by a few percent: each round subtracts the best sinusoid of
    the residual and refines ω on the cleaned scores within half a frequency bin.
    """
    n = len(scores)
    t = np.arange(n, dtype=float) - (n - 1) / 2
    omega, half_bin = best_frequency(scores), np.pi / n
    for _ in range(rounds):
        resid = scores - _evaluate(scores, omega)
        if not np.any(resid):
            break
        cleaned = scores - _evaluate(resid, best_frequency(resid))
        omega = _refine(cleaned, t, omega - half_bin, omega + half_bin)
    return omega


def _angle_stats(coords: np.ndarray, omega: float) -> tuple[float, float]:
    """Median angle advance per step and share of advances within 50 % of ω."""
    theta = np.arctan2(coords[:, 1], coords[:, 0])
    advance = np.angle(np.exp(1j * np.diff(theta)))
    consistent = np.abs(np.angle(np.exp(1j * (advance - omega)))) <= 0.5 * omega
    return float(np.median(advance)), float(np.mean(consistent))


def rotation_fit(scores: np.ndarray, components: np.ndarray, total_var: float) -> RotationFit:
    """Fit the dominant rotation of a tail from its top PC scores (W + 1, k) and components (k, h)."""
    n, h = len(scores), components.shape[1]
    if total_var <= 0 or not np.any(scores):
        return RotationFit(np.nan, 0.0, np.nan, 0.0, np.nan, 0.0, np.zeros((2, h)))
    t = np.arange(n, dtype=float) - (n - 1) / 2
    omega = dominant_frequency(scores)
    centre, axes = _sinusoid(scores, omega)
    share = _explained(np.array([omega]), t, scores)[0]
    sv = np.linalg.svd(axes, compute_uv=False)
    coords = (scores - centre) @ np.linalg.pinv(axes).T
    angle_speed, consistency = _angle_stats(coords, omega)
    basis, _ = np.linalg.qr(components.T @ axes)
    return RotationFit(
        omega=omega,
        share=share * float(np.sum(scores**2) / total_var),
        angle_speed=angle_speed,
        consistency=consistency,
        radial_trend=float(np.exp(_log_slope(np.linalg.norm(coords, axis=1))[0])),
        aspect=float(_safe_ratio(sv[-1], sv[0])),
        plane=basis.T,
    )
