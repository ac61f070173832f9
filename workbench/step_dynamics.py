"""Step dynamics: how big successive steps are, how they turn, and how fast they change."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ._frames import as_states, position_step_frame


def step_dynamics(states: np.ndarray, tokens: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (position, step) with Δ_i = z_i − z_{i−1}:

    ``delta_norm`` ‖Δ_i‖ (NaN at step 0); ``delta_cosine`` cos(Δ_i, Δ_{i−1}) (NaN before step 2;
    steps that shrink and turn orthogonal go to 0); ``acceleration`` ‖Δ_i − Δ_{i−1}‖ / ‖z_i‖ (NaN
    before step 2), an exit signal.
    """
    z = as_states(states).astype(np.float64)
    n, T, _ = z.shape
    delta = np.diff(z, axis=0)  # Δ_1 … Δ_r
    norms = np.linalg.norm(delta, axis=-1)
    delta_norm = np.full((n, T), np.nan)
    delta_norm[1:] = norms
    cosine = np.full((n, T), np.nan)
    accel = np.full((n, T), np.nan)
    if n > 2:
        dot = (delta[1:] * delta[:-1]).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            cosine[2:] = dot / (norms[1:] * norms[:-1])
            accel[2:] = np.linalg.norm(np.diff(delta, axis=0), axis=-1) / np.linalg.norm(
                z[2:], axis=-1
            )
    return position_step_frame(
        {"delta_norm": delta_norm, "delta_cosine": cosine, "acceleration": accel}, tokens
    )
