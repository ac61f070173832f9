"""Shared plotting helpers: labels and the step colour scale."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

STEP_COLORSCALE = "Viridis"


def step_path(
    x: np.ndarray,
    y: np.ndarray,
    name: str,
    z: np.ndarray | None = None,
    showscale: bool = False,
    colorbar_x: float | None = None,
) -> go.Scatter | go.Scatter3d:
    """A path through successive steps: a thin grey line and markers coloured by step index."""
    steps = np.arange(len(x))
    marker = dict(
        color=steps,
        colorscale=STEP_COLORSCALE,
        size=5 if z is None else 3,
        showscale=showscale,
        colorbar=dict(title="step", x=colorbar_x) if showscale else None,
    )
    line = dict(color="rgba(120,120,120,0.5)", width=1)
    hover = [f"{name}<br>step {s}" for s in steps]
    if z is None:
        return go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            name=name,
            marker=marker,
            line=line,
            text=hover,
            hoverinfo="text+x+y",
        )
    return go.Scatter3d(
        x=x,
        y=y,
        z=z,
        mode="lines+markers",
        name=name,
        marker=marker,
        line=line,
        text=hover,
        hoverinfo="text",
    )
