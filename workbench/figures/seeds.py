"""Path-independence figures: seed overlays and spread-vs-step curves."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from .._frames import position_labels


def seed_overlay(
    coords_by_seed: np.ndarray,
    position: int,
    pair: tuple[int, int] = (0, 1),
    seeds: Sequence[str | int] | None = None,
    tokens: Sequence[str] | None = None,
) -> go.Figure:
    """One token's paths from every seed in one PC plane; start (○) and end (★) marked.

    coords_by_seed: (n_seeds, steps + 1, T, k), e.g. ``project(traj.states)`` over all seeds.
    """
    coords = np.asarray(coords_by_seed)
    if coords.ndim != 4:
        raise ValueError(f"coords_by_seed must be (n_seeds, steps + 1, T, k), got {coords.shape}")
    names = [str(s) for s in (range(coords.shape[0]) if seeds is None else seeds)]
    a, b = pair
    palette = qualitative.Plotly
    fig = go.Figure()
    for k, name in enumerate(names):
        path = coords[k, :, position]
        colour = palette[k % len(palette)]
        fig.add_trace(
            go.Scatter(
                x=path[:, a],
                y=path[:, b],
                mode="lines+markers",
                name=f"seed {name}",
                line=dict(color=colour),
                marker=dict(size=4, color=colour),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=path[[0, -1], a],
                y=path[[0, -1], b],
                mode="markers",
                marker=dict(symbol=["circle-open", "star"], size=12, color=colour),
                showlegend=False,
                hoverinfo="skip",
            )
        )
    label = position_labels(tokens, coords.shape[2])[position]
    fig.update_layout(
        title=f"seeds for token {label}",
        xaxis_title=f"PC{a + 1}",
        yaxis_title=f"PC{b + 1}",
        height=480,
    )
    return fig


def spread_curves(
    frame: pd.DataFrame, positions: Sequence[int] | None = None, value: str = "spread"
) -> go.Figure:
    """``value`` (from ``path_independence``) against step, one curve per token, plus the mean."""
    if value not in frame.columns:
        raise ValueError(f"no column {value!r}; the frame has {list(frame.columns)}")
    fig = go.Figure()
    chosen = frame if positions is None else frame[frame["position"].isin(list(positions))]
    for (pos, tok), group in chosen.groupby(["position", "token"], sort=True):
        g = group.sort_values("step")
        fig.add_trace(
            go.Scatter(
                x=g["step"],
                y=g[value],
                mode="lines",
                name=f"{pos}: {tok!r}",
                line=dict(width=1),
                opacity=0.6,
            )
        )
    mean = frame.groupby("step")[value].mean()
    fig.add_trace(
        go.Scatter(
            x=mean.index,
            y=mean.to_numpy(),
            mode="lines",
            name="mean over tokens",
            line=dict(color="black", width=3),
        )
    )
    fig.update_layout(
        title=f"{value} between seeds per step",
        xaxis_title="step",
        yaxis=dict(title=value, type="log"),
        height=450,
    )
    return fig
