"""Path independence: do different initial states s_0 reach the same fixed point, orbit or drift?"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ._frames import as_states, position_step_frame, token_labels


def _pairwise_mean_distance(x: np.ndarray) -> np.ndarray:
    """Mean over unordered pairs of the first axis of ‖x_a − x_b‖ (norm over the last axis)."""
    n = x.shape[0]
    total = np.zeros(x.shape[1:-1], dtype=np.float64)
    for a in range(n):
        for b in range(a + 1, n):
            total += np.linalg.norm(x[a] - x[b], axis=-1)
    return total / (n * (n - 1) / 2)


def path_independence(
    states_by_seed: np.ndarray, tokens: Sequence[str] | None = None
) -> pd.DataFrame:
    """One row per (position, step): ``spread`` = mean pairwise distance between seeds / mean norm.

    states_by_seed: (n_seeds, steps + 1, T, h), n_seeds >= 2. Also ``distance`` (unnormalised) and
    ``mean_norm``.
    """
    z = as_states(states_by_seed, ndim=4, what="states_by_seed")
    if z.shape[0] < 2:
        raise ValueError(f"path independence needs at least 2 seeds, got {z.shape[0]}")
    distance = _pairwise_mean_distance(z)
    mean_norm = np.linalg.norm(z, axis=-1).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = distance / mean_norm
    return position_step_frame(
        {"spread": spread, "distance": distance, "mean_norm": mean_norm}, tokens
    )


def _nearest_neighbour_mean(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over the points of a of the distance to the nearest point of b; a (W, h), b (W', h)."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2.0 * a @ b.T
    return float(np.sqrt(np.clip(d2.min(axis=1), 0.0, None)).mean())


def attractor_distance(
    states_by_seed: np.ndarray, window: int = 16, tokens: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per position: how far apart the seeds' tail sets (last ``window`` states) lie, phase-blind.

    For each pair of seeds, the symmetric mean nearest-neighbour distance between their tail point
    sets; averaged over pairs and divided by the mean tail norm (``attractor_distance``).
    Small for a shared fixed point and for a shared orbit traversed with a different phase.
    ``final_spread`` is the instantaneous spread at the last step (as in ``path_independence``).
    """
    z = as_states(states_by_seed, ndim=4, what="states_by_seed").astype(np.float64)
    n_seeds, n_steps, T, _ = z.shape
    if n_seeds < 2:
        raise ValueError(f"attractor distance needs at least 2 seeds, got {n_seeds}")
    w = max(1, min(int(window), n_steps))
    tail = z[:, -w:]
    labels = token_labels(tokens, T)
    rows = []
    for t in range(T):
        pair = []
        for a in range(n_seeds):
            for b in range(a + 1, n_seeds):
                pa, pb = tail[a, :, t], tail[b, :, t]
                pair.append(
                    0.5 * (_nearest_neighbour_mean(pa, pb) + _nearest_neighbour_mean(pb, pa))
                )
        norm = np.linalg.norm(tail[:, :, t], axis=-1).mean()
        final = _pairwise_mean_distance(z[:, -1, t][:, None])[0]
        final_norm = np.linalg.norm(z[:, -1, t], axis=-1).mean()
        rows.append(
            {
                "position": t,
                "token": labels[t],
                "attractor_distance": float(np.mean(pair) / norm) if norm > 0 else np.nan,
                "final_spread": float(final / final_norm) if final_norm > 0 else np.nan,
                "window": w,
            }
        )
    return pd.DataFrame(rows)
