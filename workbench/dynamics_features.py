"""Per-token measurements on the tails of latent trajectories (used by `workbench.dynamics`).

A tail is an array (W + 1, h): the last W steps of one token's states; every function takes a batch
of tails (T, W + 1, h) and returns one number per token. The rotation fit lives in
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


def _times(n: int) -> np.ndarray:
    return np.arange(n, dtype=float) - (n - 1) / 2


def _log_slope(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row slope and R² of least-squares lines through log(values) (T, n) against the index."""
    logs = np.log(values + _TINY)
    logs -= logs.mean(axis=1, keepdims=True)
    t = _times(values.shape[1])
    slope = logs @ t / np.sum(t**2)
    total = np.sum(logs**2, axis=1)
    resid = np.sum((logs - slope[:, None] * t) ** 2, axis=1)
    return slope, np.where(total > 0, 1 - _safe_ratio(resid, total), 0.0)


def _chunk_motion(points: np.ndarray, steps: np.ndarray, chunks: int) -> tuple[np.ndarray, ...]:
    """Settling ratio, chunk shrink and chunk contraction (each (T,)) from the means of `chunks`
    equal chunks at the end of points (T, n, d), with step norms (T, n − 1).

    settling ratio = ‖last chunk mean − the one before‖ / mean step norm over those two chunks:
    about 1/sqrt(L) (L = chunk length) for i.i.d. jitter around a point, about sqrt(2L/3) for a
    random walk and about L for a steady drift. chunk shrink = D_last / D_first, the displacements D
    between successive chunk means, when they shrink monotonically (a geometric approach averaged
    over noise), else 1; chunk contraction = its per-step rate shrink^(1 / (L (chunks − 2))).
    """
    n = points.shape[1]
    size = max(1, (n - 1) // chunks)
    ends = n - np.arange(chunks, 0, -1) * size
    means = np.stack([points[:, e : e + size].mean(axis=1) for e in ends], axis=1)
    disp = np.linalg.norm(np.diff(means, axis=1), axis=2)  # (T, chunks - 1)
    settling = _safe_ratio(disp[:, -1], steps[:, -2 * size :].mean(axis=1))
    monotone = (disp[:, 0] > 0) & np.all(np.diff(disp, axis=1) < 0, axis=1)
    shrink = np.where(monotone, _safe_ratio(disp[:, -1], disp[:, 0]), 1.0)
    return settling, shrink, shrink ** (1 / (size * (chunks - 2)))


def convergence_features(
    tails: np.ndarray, scores: np.ndarray, last: int = 4, chunks: int = 4
) -> dict[str, np.ndarray]:
    """Step-size measurements (each (T,)) of tails (T, W + 1, h) with their top PC scores.

    `final_step_size` ‖x_r − x_{r−1}‖/‖x_r‖ and `tail_relative_step` (median of the last `last`);
    `contraction` = exp(slope) of a least-squares line through the log step norms measured in the
    top-3 PC space (where i.i.d. noise is mostly projected out), the ratio of successive steps (< 1
    for geometric convergence), and `contraction_fit` its R². `spread` = RMS distance to the tail
    mean / mean norm; `settling_ratio`, `chunk_shrink` and `chunk_contraction` (see `_chunk_motion`,
    `chunks` chunks) come from the top-3 PC scores too.
    """
    steps = np.linalg.norm(np.diff(tails, axis=1), axis=2)
    norms = np.linalg.norm(tails[:, 1:], axis=2)
    rel = _safe_ratio(steps, norms)
    top = scores[:, :, :3]
    top_steps = np.linalg.norm(np.diff(top, axis=1), axis=2)
    slope, fit = _log_slope(top_steps)
    spread_sq = np.mean(np.sum((tails - tails.mean(axis=1, keepdims=True)) ** 2, axis=2), axis=1)
    settling, shrink, chunk_contraction = _chunk_motion(top, top_steps, chunks)
    return dict(
        final_step_size=rel[:, -1],
        tail_relative_step=np.median(rel[:, -last:], axis=1),
        contraction=np.exp(slope),
        contraction_fit=fit,
        spread=_safe_ratio(np.sqrt(spread_sq), norms.mean(axis=1)),
        settling_ratio=settling,
        chunk_shrink=shrink,
        chunk_contraction=chunk_contraction,
    )


def _coarse_straightness(points: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Net displacement / path length of points (T, n, d) sampled at indices idx."""
    coarse = points[:, idx]
    path = np.sum(np.linalg.norm(np.diff(coarse, axis=1), axis=2), axis=1)
    return _safe_ratio(np.linalg.norm(coarse[:, -1] - coarse[:, 0], axis=1), path)


def drift_features(tails: np.ndarray, scores: np.ndarray, chunks: int = 8) -> dict[str, np.ndarray]:
    """Directional drift of tails (T, W + 1, h): velocity, its variance share, straightness.

    `drift_velocity_norm` = ‖β‖ of x_t ≈ x̄ + β (t − t̄) (distance per step); `drift_variance_share` =
    the share of tail variance along β; `straightness` = net displacement / path length, the path
    measured over `chunks` equal chunks so that per-step noise does not inflate it (a random walk
    scores about 1/sqrt(chunks), a straight drift 1); `pc_straightness` the same in the top-3 PC
    space, where i.i.d. noise is mostly projected out.
    """
    n = tails.shape[1]
    t = _times(n)
    centred = tails - tails.mean(axis=1, keepdims=True)
    beta = np.einsum("n,tnh->th", t, centred) / np.sum(t**2)
    speed = np.linalg.norm(beta, axis=1)
    along = np.einsum("tnh,th->tn", centred, _safe_ratio(beta, speed[:, None]))
    idx = np.unique(np.r_[np.arange(0, n, max(1, (n - 1) // chunks)), n - 1])
    return dict(
        pc_straightness=_coarse_straightness(scores[:, :, :3], idx),
        drift_velocity_norm=speed,
        drift_variance_share=_safe_ratio(np.sum(along**2, axis=1), np.sum(centred**2, axis=(1, 2))),
        straightness=_coarse_straightness(tails, idx),
    )
