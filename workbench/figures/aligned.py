"""Aligned embeddings of one token's trajectories (`workbench.aligned_umap`) side by side."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots


def aligned_embeddings_figure(
    embeddings: Sequence[np.ndarray], names: Sequence[str], title: str = ""
) -> go.Figure:
    """One panel per trajectory (a seed or a checkpoint): its aligned 2-D embedding as a path,
    coloured by step, start (○) and end (★) marked; the panels share their axes, since the
    alignment gives the embeddings one layout."""
    if len(embeddings) != len(names):
        raise ValueError(f"{len(embeddings)} embeddings but {len(names)} names")
    for i, e in enumerate(embeddings):
        if np.ndim(e) != 2 or np.shape(e)[1] < 2:
            raise ValueError(f"embedding {i} must be (steps + 1, >= 2), got {np.shape(e)}")
    fig = make_subplots(
        rows=1,
        cols=len(embeddings),
        subplot_titles=list(names),
        shared_xaxes=True,
        shared_yaxes=True,
    )
    palette = qualitative.Plotly
    for k, e in enumerate(embeddings):
        e = np.asarray(e)
        colour = palette[k % len(palette)]
        fig.add_trace(
            go.Scatter(
                x=e[:, 0],
                y=e[:, 1],
                mode="lines+markers",
                name=str(names[k]),
                line=dict(color=colour, width=1),
                marker=dict(size=6, color=np.arange(len(e)), colorscale="Viridis"),
                hovertext=[f"step {i}" for i in range(len(e))],
            ),
            row=1,
            col=k + 1,
        )
        fig.add_trace(
            go.Scatter(
                x=e[[0, -1], 0],
                y=e[[0, -1], 1],
                mode="markers",
                marker=dict(symbol=["circle-open", "star"], size=12, color=colour),
                showlegend=False,
                hoverinfo="skip",
            ),
            row=1,
            col=k + 1,
        )
    fig.update_layout(title=title or "aligned UMAP", height=380, showlegend=False)
    return fig
