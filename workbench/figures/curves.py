"""Simple curves and bars: steps per token (adaptive exit), step dynamics, token correlation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .._frames import position_labels
from ._style import LEGEND_TOP_K, log_axis, token_lines, words


def steps_per_token_bars(
    steps: Sequence[int], tokens: Sequence[str] | None = None, max_steps: int | None = None
) -> go.Figure:
    """Bars of the iterations spent on each (generated) token, e.g. with an adaptive exit."""
    counts = np.asarray(list(steps))
    labels = position_labels(tokens, len(counts))
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=counts,
            marker=dict(color=counts, colorscale="Viridis"),
            hovertemplate="%{x}<br>%{y} steps<extra></extra>",
        )
    )
    if max_steps is not None:
        fig.add_hline(y=max_steps, line_dash="dash", annotation_text=f"max {max_steps}")
    fig.update_layout(
        title=f"steps per token (mean {counts.mean():.1f})" if len(counts) else "steps per token",
        xaxis=dict(title="token", type="category"),
        yaxis_title="steps",
        height=400,
    )
    return fig


def step_curves(
    frame: pd.DataFrame,
    value: str,
    positions: Sequence[int] | None = None,
    log: bool = True,
    top_k: int = LEGEND_TOP_K,
) -> go.Figure:
    """``value`` of a (position, step) frame (e.g. step_dynamics' acceleration) per step and token;
    the ``top_k`` tokens with the largest last value are coloured and in the legend, the others
    grey and named on hover."""
    if value not in frame.columns:
        raise ValueError(f"no column {value!r}; the frame has {list(frame.columns)}")
    chosen = frame if positions is None else frame[frame["position"].isin(list(positions))]
    fig = go.Figure()
    token_lines(fig, chosen, value, top_k)
    n = chosen["position"].nunique()
    note = f" (legend: the {top_k} largest at the last step of {n}; hover for the rest)"
    fig.update_layout(
        title=f"{words(value)} per step" + (note if n > top_k else ""),
        xaxis_title="step",
        yaxis=log_axis(chosen[value], words(value)) if log else dict(title=words(value)),
        height=420,
    )
    return fig


def token_correlation_curve(frame: pd.DataFrame) -> go.Figure:
    """Token correlation (from ``token_correlation``) against step; 1.0 means collapse."""
    fig = go.Figure(
        go.Scatter(
            x=frame["step"], y=frame["correlation"], mode="lines+markers", name="token correlation"
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="collapse")
    fig.update_layout(
        title="token correlation per step",
        xaxis_title="step",
        yaxis=dict(title="mean off-diagonal correlation", range=[-0.1, 1.05]),
        height=380,
    )
    return fig
