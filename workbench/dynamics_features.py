"""Per-token measurements on the tails of latent trajectories (used by `workbench.dynamics`).

A tail is an array (W + 1, h): the last W steps of one token's states; every function takes a batch
of tails (T, W + 1, h) and returns one number per token. The rotation fit lives in
`workbench.dynamics_rotation`; `workbench.dynamics` turns the numbers into a kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TINY = 1e-30


def _safe_ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """num / den, 0 where den is 0 (a zero trajectory does not move)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


@dataclass(frozen=True)
class TailPCA:
    """Per-token PCA of tails (T, n, h), n = W + 1, through the n × n Gram matrix of the centred
    tail (cheap for large h): `gram` (T, n, n), top-k `scores` (T, n, k), `total` variance (T,),
    and `weights` (T, n, k) with components = weightsᵀ · tail (see `components`)."""

    gram: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    total: np.ndarray

    def components(self, tails: np.ndarray) -> np.ndarray:
        """Unit principal directions (T, k, h); zero for components of zero variance.

        The weights are orthogonal to the constant vector, so the uncentred tails give the same."""
        return np.swapaxes(self.weights, 1, 2) @ tails


def tail_pca(tails: np.ndarray, k: int) -> TailPCA:
    """PCA of each token's tail (T, n, h), keeping k components."""
    centred = tails - tails.mean(axis=1, keepdims=True)
    gram = centred @ np.swapaxes(centred, 1, 2)
    evals, evecs = np.linalg.eigh(gram)
    evals, evecs = np.clip(evals[:, ::-1][:, :k], 0, None), evecs[:, :, ::-1][:, :, :k]
    sd = np.sqrt(evals)
    keep = sd > 1e-9 * np.maximum(sd[:, :1], _TINY)
    inv = np.divide(1.0, sd, out=np.zeros_like(sd), where=keep)
    return TailPCA(
        gram=gram,
        scores=evecs * (sd * keep)[:, None, :],
        weights=evecs * inv[:, None, :],
        total=np.trace(gram, axis1=1, axis2=2),
    )


def _sq_norms(x: np.ndarray) -> np.ndarray:
    """Squared norms along the last axis, without a temporary of x's size."""
    return np.einsum("...h,...h->...", x, x)


def _times(n: int) -> np.ndarray:
    return np.arange(n, dtype=float) - (n - 1) / 2


def row_dot(rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    """rows (..., n) · t (n,), each row summed on its own: a matrix–vector product rounds a row
    differently by where it falls in the matrix, and a token's numbers must not depend on the
    tokens classified beside it."""
    return np.sum(rows * t, axis=-1)


def _log_slope(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row slope and R² of least-squares lines through log(values) (T, n) against the index."""
    logs = np.log(values + _TINY)
    logs -= logs.mean(axis=1, keepdims=True)
    t = _times(values.shape[1])
    slope = row_dot(logs, t) / np.sum(t**2)
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


def _step_decay(steps: np.ndarray, parts: int = 3) -> np.ndarray:
    """Per row of step norms (T, n), the mean of the last of `parts` equal parts / the mean of the
    first: about q^(n (parts − 1) / parts) for steps that shrink by q per step, however noisy or
    alternating the single steps are (a damped flip), and about 1 on an orbit or a drift."""
    size = max(1, steps.shape[1] // parts)
    return _safe_ratio(steps[:, -size:].mean(axis=1), steps[:, :size].mean(axis=1))


def relative_steps(tails: np.ndarray, last: int = 4) -> dict[str, np.ndarray]:
    """The relative steps ‖x_t − x_{t−1}‖/‖x_t‖ of tails (T, W + 1, h) that decide a settled
    fixed point: `final_step_size` (the last), `tail_relative_step` (median of the last `last`)
    and `max_tail_relative_step` (their largest), each (T,)."""
    steps = np.sqrt(_sq_norms(np.diff(tails[:, -last - 1 :], axis=1)))  # exact for tiny steps
    rel = _safe_ratio(steps, np.sqrt(_sq_norms(tails[:, -last:])))
    return dict(
        final_step_size=rel[:, -1],
        tail_relative_step=np.median(rel, axis=1),
        max_tail_relative_step=rel.max(axis=1),
    )


def convergence_features(
    tails: np.ndarray, pca: TailPCA, last: int = 4, chunks: int = 4
) -> dict[str, np.ndarray]:
    """Step-size measurements (each (T,)) of tails (T, W + 1, h) with their PCA.

    The relative steps of `relative_steps`; `step_decay` (see `_step_decay`) from the top-3 PC
    step norms;
    `contraction` = exp(slope) of a least-squares line through the log step norms measured in the
    top-3 PC space (where i.i.d. noise is mostly projected out), the ratio of successive steps (< 1
    for geometric convergence), and `contraction_fit` its R². `spread` = RMS distance to the tail
    mean / mean norm; `settling_ratio`, `chunk_shrink` and `chunk_contraction` (see `_chunk_motion`,
    `chunks` chunks) come from the top-3 PC scores too.
    """
    norms = np.sqrt(_sq_norms(tails[:, 1:]))
    top = pca.scores[:, :, :3]
    top_steps = np.linalg.norm(np.diff(top, axis=1), axis=2)
    slope, fit = _log_slope(top_steps)
    settling, shrink, chunk_contraction = _chunk_motion(top, top_steps, chunks)
    return relative_steps(tails, last) | dict(
        step_decay=_step_decay(top_steps),
        contraction=np.exp(slope),
        contraction_fit=fit,
        spread=_safe_ratio(np.sqrt(pca.total / tails.shape[1]), norms.mean(axis=1)),
        settling_ratio=settling,
        chunk_shrink=shrink,
        chunk_contraction=chunk_contraction,
    )


def _gram_distances(gram: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """‖x_i − x_j‖ (T, len(i)) from the centred Gram matrices (T, n, n)."""
    diag = np.diagonal(gram, axis1=1, axis2=2)
    sq = diag[:, i] + diag[:, j] - 2 * gram[:, i, j]
    return np.sqrt(np.clip(sq, 0, None))


def _straightness(dist: np.ndarray, net: np.ndarray) -> np.ndarray:
    return _safe_ratio(net, np.sum(dist, axis=1))


def drift_features(pca: TailPCA, chunks: int = 8) -> dict[str, np.ndarray]:
    """Directional drift of each tail from its PCA (Gram matrix): velocity, share, straightness.

    `drift_velocity_norm` = ‖β‖ of x_t ≈ x̄ + β (t − t̄) (distance per step);
    `drift_variance_share` = the share of tail variance along β; `straightness` = net displacement /
    path length, the path measured over `chunks` equal chunks so that per-step noise does not
    inflate it (a random walk scores about 1/sqrt(chunks), a straight drift 1); `pc_straightness`
    the same in the top-3 PC space, where i.i.d. noise is mostly projected out.
    """
    n = pca.gram.shape[1]
    t = _times(n)
    norm_t = np.sum(t**2)
    g_t = row_dot(pca.gram, t)  # (T, n): c_s · Σ_t t c_t
    speed_sq = row_dot(g_t, t) / norm_t**2
    speed = np.sqrt(np.clip(speed_sq, 0, None))
    along_sq = _safe_ratio(np.sum(g_t**2, axis=1), norm_t**2 * speed_sq)
    idx = np.unique(np.r_[np.arange(0, n, max(1, (n - 1) // chunks)), n - 1])
    ends = (np.array([0]), np.array([n - 1]))
    coarse = pca.scores[:, idx, :3]
    top_path = np.linalg.norm(np.diff(coarse, axis=1), axis=2)
    top_net = np.linalg.norm(coarse[:, -1] - coarse[:, 0], axis=1)
    return dict(
        pc_straightness=_straightness(top_path, top_net),
        drift_velocity_norm=speed,
        drift_variance_share=_safe_ratio(along_sq, pca.total),
        straightness=_straightness(
            _gram_distances(pca.gram, idx[:-1], idx[1:]), _gram_distances(pca.gram, *ends)[:, 0]
        ),
    )


def _last_above(values: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Per row, 1 + the index of the last entry of values (T, m) above limit (T,), else 0."""
    above = values > limit[:, None]
    return np.where(above.any(axis=1), above.shape[1] - np.argmax(above[:, ::-1], axis=1), 0)


def transient_end(
    runs: np.ndarray, tail: int, k: int = 6, factor: float = 1.5, margin: int = 2
) -> np.ndarray:
    """Per token (T,), the first state after the transient of whole runs (T, n, h).

    Measured in the top-`k` PC space of the whole run (where i.i.d. noise is mostly projected
    out) against the last `tail` steps, taken to be on the attractor: the transient lasts while
    a step is larger than `factor` × the largest step of the tail (a decaying transient moves
    faster than the motion it settles into), and while a state is farther from the tail's mean
    than `factor` × the farthest tail state (a slow transient is still away from the attractor).
    The end is the first state after both, plus `margin`; a run with neither starts at 0. The
    result is at most n − 1 − tail (the start of the tail).
    """
    n = runs.shape[1]
    first = n - 1 - tail  # the tail's first state
    scores = tail_pca(runs, k).scores
    steps = np.linalg.norm(np.diff(scores, axis=1), axis=2)  # step j goes from state j to j + 1
    fast = _last_above(steps[:, :first], factor * steps[:, first:].max(axis=1))
    dist = np.linalg.norm(scores - scores[:, first:].mean(axis=1, keepdims=True), axis=2)
    far = _last_above(dist[:, :first], factor * dist[:, first:].max(axis=1))
    end = np.maximum(fast, far)
    return np.minimum(np.where(end > 0, end + margin, 0), first)
