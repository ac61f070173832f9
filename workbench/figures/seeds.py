"""Path-independence figures: seed overlays and spread-vs-step curves."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from .._frames import position_labels
from ._style import LEGEND_TOP_K, log_axis, token_lines, words


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


ATTRACTOR_NOTE = (
    "The spread at the last step is where these curves end. The attractor distance compares the "
    "seeds' last window of states as point sets, so it also counts steps before the seeds met "
    "and can exceed it."
)
NOTE_DROP_PX = 58  # the note's top below the plot area: under the x tick labels and axis title


def spread_curves(
    frame: pd.DataFrame,
    positions: Sequence[int] | None = None,
    value: str = "spread",
    top_k: int = LEGEND_TOP_K,
) -> go.Figure:
    """``value`` (from ``path_independence``) against step: the mean over tokens (thick black, first
    in the legend), one line per token (the ``top_k`` largest at the last step coloured and in the
    legend, the rest grey and named on hover), and ``ATTRACTOR_NOTE`` under the plot."""
    if value not in frame.columns:
        raise ValueError(f"no column {value!r}; the frame has {list(frame.columns)}")
    fig = go.Figure()
    chosen = frame if positions is None else frame[frame["position"].isin(list(positions))]
    mean = chosen.groupby("step")[value].mean()
    fig.add_trace(
        go.Scatter(
            x=mean.index,
            y=mean.to_numpy(),
            mode="lines",
            name="mean over tokens",
            line=dict(color="black", width=3),
            legendrank=1,
        )
    )
    token_lines(fig, chosen, value, top_k)
    fig.add_annotation(
        text=ATTRACTOR_NOTE.replace(". ", ".<br>", 1), xref="paper", yref="paper", x=0, y=0,
        yanchor="top", yshift=-NOTE_DROP_PX, showarrow=False, xanchor="left", align="left",
        font=dict(size=11, color="#555"),
    )  # fmt: skip
    fig.update_layout(
        title=f"{words(value)} per step",
        xaxis_title="step",
        yaxis=log_axis(chosen[value], words(value)),
        height=500,
        margin=dict(b=NOTE_DROP_PX + 60),
        showlegend=True,
    )
    return fig
