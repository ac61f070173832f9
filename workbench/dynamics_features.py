"""Per-token measurements on the tail of one latent trajectory (used by `workbench.dynamics`).

A tail is an array (W + 1, h): the last W steps of one token's states. `tail_pca` is batched over
tokens; the other functions take one tail (and its PC scores). The rotation fit lives in
`workbench.dynamics_rotation`; `workbench.dynamics` turns the numbers into a kind.
"""

from __future__ import annotations

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
