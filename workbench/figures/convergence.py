"""The convergence heatmap: tokens × steps, colour = distance (log scale)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .._frames import position_labels
from ._style import log_colour, words


def frame_matrix(frame: pd.DataFrame, value: str) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(T, steps) matrix of ``value`` from a (position, step) long frame, row labels, step values."""
    if value not in frame.columns:
        raise ValueError(f"no column {value!r}; the frame has {list(frame.columns)}")
    table = frame.pivot(index="position", columns="step", values=value).sort_index()
    tokens = frame.drop_duplicates("position").set_index("position").loc[table.index, "token"]
    return (
        table.to_numpy(dtype=float),
        position_labels(list(tokens), len(tokens)),
        table.columns.to_numpy(),
    )


def convergence_heatmap(
    frame: pd.DataFrame,
    value: str = "distance_to_final",
    log: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Heatmap of ``value`` (a ``convergence`` column) with token labels; log10 colour by default."""
    matrix, labels, steps = frame_matrix(frame, value)
    colour = matrix
    colorbar: dict = dict(title=words(value))
    if log:
        colour, ticks = log_colour(matrix)
        colorbar.update(ticks)
    fig = go.Figure(
        go.Heatmap(
            z=colour,
            x=steps,
            y=labels,
            customdata=matrix,
            colorscale="Viridis",
            colorbar=colorbar,
            hovertemplate="%{y}<br>step %{x}<br>"
            + words(value)
            + " %{customdata:.4g}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or f"{words(value)} per token and step" + (" (log scale)" if log else ""),
        xaxis_title="step",
        yaxis=dict(title="token", autorange="reversed", type="category"),
        height=max(300, 18 * len(labels) + 120),
    )
    return fig
