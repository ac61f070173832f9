"""The wavefront figure: sampler step × position, coloured by core iterations, frozen frontier drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .._frames import shown_token

REQUIRED = ("step", "position", "recurrence", "token", "frozen")
FRONTIER_COLOUR = "#ff2fb9"  # magenta: visible on every Viridis colour and on the white legend
WAVE_COLOUR = "#e31a1c"


def wavefront_heatmap(
    frame: pd.DataFrame,
    frontier: pd.DataFrame,
    token_text: dict[int, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Heatmap of ``recurrence`` over (position, sampler step) from ``workbench.wavefront_frame``,
    with the frozen frontier (last frozen position) and the wave's leading edge as lines from
    ``workbench.frontier_frame``. ``token_text`` maps token ids to strings for the hover text."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks columns {missing}; build it with workbench.wavefront_frame")
    if frame.empty:
        raise ValueError("the wavefront frame is empty (no sampler step ran)")
    table = frame.pivot(index="step", columns="position", values="recurrence").sort_index()
    tokens = frame.pivot(index="step", columns="position", values="token").reindex_like(table)
    frozen = frame.pivot(index="step", columns="position", values="frozen").reindex_like(table)

    def describe(tok: float, is_frozen: object) -> str:
        if np.isnan(tok):
            return ""
        text = token_text.get(int(tok), str(int(tok))) if token_text else str(int(tok))
        return f"{shown_token(text)} ({'frozen' if is_frozen is True else 'guess'})"

    hover = np.vectorize(describe, otypes=[object])(tokens.to_numpy(dtype=float),
                                                    frozen.to_numpy(dtype=object))  # fmt: skip
    fig = go.Figure(
        go.Heatmap(
            z=table.to_numpy(dtype=float),
            x=table.columns.to_numpy(),
            y=table.index.to_numpy(),
            customdata=hover,
            colorscale="Viridis",
            colorbar=dict(title="core iterations"),
            hovertemplate="position %{x}, step %{y}<br>%{customdata}<br>"
            "%{z} iterations<extra></extra>",
        )
    )
    if not frontier.empty:
        fig.add_trace(go.Scatter(
            x=frontier["frozen_length"] - 0.5, y=frontier["step"], mode="lines",
            line=dict(color=FRONTIER_COLOUR, width=3, shape="hv"), name="frozen frontier",
        ))  # fmt: skip
        fig.add_trace(go.Scatter(
            x=frontier["wave_end"] - 0.5, y=frontier["step"], mode="lines",
            line=dict(color=WAVE_COLOUR, width=2, dash="dot", shape="hv"), name="wave front",
        ))  # fmt: skip
    fig.update_layout(
        title=title or "Diffusion sampler wavefront: core iterations per position and step",
        xaxis_title="position",
        yaxis=dict(title="sampler step", autorange="reversed"),
        height=min(1100, max(420, 14 * len(table) + 180)),
        legend=dict(orientation="h", x=0, y=1.0, xanchor="left", yanchor="bottom"),
        margin=dict(t=110),
    )
    return fig
