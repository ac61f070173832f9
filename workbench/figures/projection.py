"""Projection figures: per-token PC-pair panels, the 3-D waterfall, a rotation panel."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._frames import position_labels
from ._style import step_path

DEFAULT_PAIRS = ((0, 1), (2, 3), (4, 5))


def pc_pair_panels(
    coords: np.ndarray,
    positions: Sequence[int],
    tokens: Sequence[str] | None = None,
    pairs: Sequence[tuple[int, int]] = DEFAULT_PAIRS,
    explained_variance: Sequence[float] | None = None,
) -> go.Figure:
    """One row per token, one column per PC pair; each path centred on the token's mean, by step.

    coords: (steps + 1, T, k) from ``project``. explained_variance: ratios to label the axes.
    """
    coords = np.asarray(coords)
    if coords.ndim != 3:
        raise ValueError(f"coords must be (steps + 1, T, k), got shape {coords.shape}")
    k = coords.shape[-1]
    pairs = [p for p in pairs if max(p) < k]
    if not pairs or not positions:
        raise ValueError(f"need at least one token and one PC pair within the {k} components")
    labels = position_labels(tokens, coords.shape[1])

    def axis(c: int) -> str:
        ev = f" ({100 * explained_variance[c]:.1f}%)" if explained_variance is not None else ""
        return f"PC{c + 1}{ev}"

    fig = make_subplots(
        rows=len(positions),
        cols=len(pairs),
        subplot_titles=[f"{labels[p]} · PC{a + 1}/PC{b + 1}" for p in positions for a, b in pairs],
    )
    for r, p in enumerate(positions):
        path = coords[:, p] - coords[:, p].mean(axis=0)
        for c, (a, b) in enumerate(pairs):
            first = r == 0 and c == 0
            fig.add_trace(
                step_path(path[:, a], path[:, b], labels[p], showscale=first), row=r + 1, col=c + 1
            )
            fig.update_xaxes(title_text=axis(a), row=r + 1, col=c + 1)
            fig.update_yaxes(title_text=axis(b), row=r + 1, col=c + 1)
    fig.update_layout(showlegend=False, height=300 * len(positions), title="PC pairs per token")
    return fig


def waterfall_3d(
    coords: np.ndarray,
    tokens: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    components: tuple[int, int] = (0, 1),
) -> go.Figure:
    """Every token's path in (PC a, PC b) stacked along the token position: a 3-D waterfall."""
    coords = np.asarray(coords)
    if coords.ndim != 3:
        raise ValueError(f"coords must be (steps + 1, T, k), got shape {coords.shape}")
    labels = position_labels(tokens, coords.shape[1])
    positions = range(coords.shape[1]) if positions is None else positions
    a, b = components
    fig = go.Figure()
    for i, p in enumerate(positions):
        depth = np.full(coords.shape[0], p)
        fig.add_trace(
            step_path(depth, coords[:, p, a], labels[p], z=coords[:, p, b], showscale=i == 0)
        )
    fig.update_layout(
        title="trajectories by token position",
        showlegend=False,
        scene=dict(
            xaxis_title="token position", yaxis_title=f"PC{a + 1}", zaxis_title=f"PC{b + 1}"
        ),
        height=650,
    )
    return fig


def rotation_panel(token_states: np.ndarray, plane: np.ndarray, label: str = "") -> go.Figure:
    """One token's path in a plane (2, h) of state space, centred, and its unwrapped angle per step.

    token_states: (steps + 1, h). plane: two vectors spanning the plane (orthonormalised here).
    """
    x = np.asarray(token_states, dtype=np.float64)
    basis = np.asarray(plane, dtype=np.float64)
    if x.ndim != 2 or basis.shape != (2, x.shape[1]):
        raise ValueError(
            f"need token_states (steps + 1, h) and plane (2, h); got {x.shape}, {basis.shape}"
        )
    q, _ = np.linalg.qr(basis.T)
    xy = (x - x.mean(axis=0)) @ q
    angle = np.unwrap(np.arctan2(xy[:, 1], xy[:, 0]))
    steps = np.arange(len(x))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("path in the plane", "angle (unwrapped)"))
    fig.add_trace(step_path(xy[:, 0], xy[:, 1], label or "token", showscale=True), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=angle, mode="lines+markers", name="angle"), row=1, col=2)
    fig.update_xaxes(title_text="u1", row=1, col=1)
    fig.update_yaxes(title_text="u2", scaleanchor="x", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_yaxes(title_text="radians", row=1, col=2)
    fig.update_layout(showlegend=False, title=f"rotation {label}".strip(), height=420)
    return fig
