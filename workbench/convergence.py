"""Convergence of each token's latent: distance to the final state and relative step size."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ._frames import as_states, position_step_frame


def convergence(
    states: np.ndarray,
    reference: np.ndarray | None = None,
    tokens: Sequence[str] | None = None,
    lens_frame: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (position, step): ``distance_to_final`` ‖z_i − z*‖ and ``relative_step``.

    states: (steps + 1, T, h) for one run. z* is the last state unless ``reference`` (T, h) is given
    (e.g. the state after many more steps). relative_step = ‖z_i − z_{i−1}‖ / ‖z_i‖ (NaN at step 0).
    ``lens_frame`` (from ``workbench.lens`` on the same run) adds ``kl_to_final`` and ``entropy``.
    """
    z = as_states(states)
    ref = z[-1] if reference is None else np.asarray(reference, dtype=z.dtype)
    if ref.shape != z.shape[1:]:
        raise ValueError(f"reference must be (T, h) = {z.shape[1:]}, got {ref.shape}")
    distance = np.linalg.norm(z - ref[None], axis=-1)
    norms = np.linalg.norm(z, axis=-1)
    relative = np.full(distance.shape, np.nan, dtype=np.float64)
    relative[1:] = relative_step_sizes(z)
    frame = position_step_frame(
        {"distance_to_final": distance, "relative_step": relative, "norm": norms}, tokens
    )
    if lens_frame is not None:
        extra = lens_frame[["position", "step", "kl_to_final", "entropy"]]
        if len(extra) != len(frame):
            raise ValueError(f"lens_frame has {len(extra)} rows, expected {len(frame)}")
        frame = frame.merge(extra, on=["position", "step"], how="left", validate="one_to_one")
    return frame


def relative_step_sizes(states: np.ndarray, chunk: int = 16) -> np.ndarray:
    """‖z_i − z_{i−1}‖ / ‖z_i‖ for i = 1 … steps of states (steps + 1, T, h), as float64 (steps, T).

    Computed in the states' own precision (float32 stays float32, widened at the end), ``chunk``
    positions at a time so each block's temporaries stay in cache. Every norm reduces one
    position's h numbers, so a position's value is the same bits in any block: the app's
    convergence frame and the corpus engine's column share them exactly."""
    out = np.empty((max(states.shape[0] - 1, 0), states.shape[1]), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for start in range(0, states.shape[1], chunk):
            z = states[:, start : start + chunk]
            step = np.linalg.norm(np.diff(z, axis=0), axis=-1)
            out[:, start : start + chunk] = step / np.linalg.norm(z[1:], axis=-1)
    return out


def steps_to_converge(frame: pd.DataFrame, eps: float = 1e-2) -> pd.DataFrame:
    """Per position: the first step i after which relative_step stays below ``eps`` (from i on).

    ``frame`` is the output of ``convergence``. Positions that never settle get <NA>.
    """
    rows = []
    for (position, token), group in frame.groupby(["position", "token"], sort=True):
        rel = group.sort_values("step")
        steps = rel["step"].to_numpy()
        above = np.flatnonzero(~(rel["relative_step"].to_numpy()[1:] < eps))
        if len(above) == 0:
            first = int(steps[1]) if len(steps) > 1 else pd.NA
        elif above[-1] + 2 < len(steps):
            first = int(steps[above[-1] + 2])
        else:
            first = pd.NA
        rows.append({"position": position, "token": token, "steps_to_converge": first})
    out = pd.DataFrame(rows)
    out["steps_to_converge"] = out["steps_to_converge"].astype("Int64")
    return out
