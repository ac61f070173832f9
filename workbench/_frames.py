"""Shared helpers: checking state arrays and building (position, step) long-format frames."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def as_states(states: np.ndarray, ndim: int = 3, what: str = "states") -> np.ndarray:
    """``states`` as float32 (float64 kept), with the expected number of axes or a clear error."""
    arr = np.asarray(states)
    if arr.ndim != ndim:
        shape = "(steps + 1, T, h)" if ndim == 3 else "(n_seeds, steps + 1, T, h)"
        raise ValueError(f"{what} must be {shape}, got shape {arr.shape}")
    if arr.dtype != np.float64:
        arr = arr.astype(np.float32, copy=False)
    return arr


def token_labels(tokens: Sequence[str] | None, n: int) -> np.ndarray:
    """Token strings for n positions (the position number when none are given)."""
    if tokens is None:
        return np.asarray([str(i) for i in range(n)], dtype=object)
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} token strings for {n} positions")
    return np.asarray(list(tokens), dtype=object)


def position_labels(tokens: Sequence[str] | None, n: int, width: int = 40) -> list[str]:
    """Unique display labels "i: 'token'" for n positions, cut to ``width`` characters (the
    position alone when no tokens are given): the one label format of figures and the app."""
    if tokens is None:
        return [str(i) for i in range(n)]
    return [f"{i}: {t!r}"[:width] for i, t in enumerate(token_labels(tokens, n))]


def position_step_frame(
    columns: dict[str, np.ndarray], tokens: Sequence[str] | None
) -> pd.DataFrame:
    """Long frame from (steps, T) arrays: one row per (position, step), by position."""
    first = next(iter(columns.values()))
    n_steps, T = first.shape
    pos, step = np.meshgrid(np.arange(T), np.arange(n_steps), indexing="ij")
    data: dict[str, np.ndarray] = {
        "position": pos.ravel(),
        "token": token_labels(tokens, T)[pos.ravel()],
        "step": step.ravel(),
    }
    for name, values in columns.items():
        data[name] = np.asarray(values).T.ravel()
    return pd.DataFrame(data)
