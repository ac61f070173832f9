"""Token correlation per step: the collapse diagnostic of the paper's training-health appendix."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._frames import as_states


def token_correlation(states: np.ndarray) -> pd.DataFrame:
    """Mean off-diagonal correlation between the token states of each step (one row per step).

    Each token state is mean-centred over its hidden dimensions and normalised, so the entry for a
    pair of tokens is their Pearson correlation (the cosine of the centred vectors). Collapsed
    states (all tokens alike) give 1.0; a healthy model stays far below. states: (steps + 1, T, h).
    """
    z = as_states(states).astype(np.float64)
    n, T, _ = z.shape
    if T < 2:
        raise ValueError("token correlation needs at least 2 tokens")
    centred = z - z.mean(axis=-1, keepdims=True)
    norms = np.linalg.norm(centred, axis=-1, keepdims=True)
    unit = np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)
    total = (unit.sum(axis=1) ** 2).sum(-1)  # sum of all T × T cosines
    diagonal = (norms[..., 0] > 0).sum(-1)
    return pd.DataFrame({"step": np.arange(n), "correlation": (total - diagonal) / (T * (T - 1))})
