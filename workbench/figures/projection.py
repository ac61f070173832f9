"""Projection figures: per-token PC-pair panels, the 3-D waterfall, a rotation panel."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._frames import position_labels
from ._style import STEP_COLORSCALE, step_path

DEFAULT_PAIRS = ((0, 1), (2, 3), (4, 5))


def pc_pair_panels(
    coords: np.ndarray,
    positions: Sequence[int],
    tokens: Sequence[str] | None = None,
    pairs: Sequence[tuple[int, int]] = DEFAULT_PAIRS,
    explained_variance: Sequence[float] | None = None,
    run: str | None = None,
) -> go.Figure:
    """One row per token, one column per PC pair; each path centred on the token's mean, by step.

    coords: (steps + 1, T, k) from ``project``. explained_variance: ratios to label the axes.
    run: which run the states are from (e.g. "seed 0"), named in the title.
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
    fig.update_layout(
        showlegend=False, height=300 * len(positions), title="PC pairs per token" + _of(run)
    )
    return fig


WATERFALL_MAX_TOKENS = 24
WATERFALL_CAMERA = dict(eye=dict(x=1.5, y=-2.1, z=1.0), up=dict(x=0, y=0, z=1))


def _of(run: str | None) -> str:
    return f" ({run})" if run else ""


def _log_step_ticks(n_steps: int) -> dict:
    """The step colour bar's ticks: the paths move most in their first steps, so the colour runs
    on log2(step + 1) and the ticks name steps 0, 1, 2, 4, 8, …"""
    marks = [m for m in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256) if m < n_steps]
    return dict(
        title="step", tickvals=np.log2(np.asarray(marks) + 1), ticktext=[str(m) for m in marks]
    )


def _waterfall_line(
    path: np.ndarray,
    position: int,
    components: tuple[int, int],
    label: str,
    step_ticks: dict,
    with_scale: bool,
) -> go.Scatter3d:
    """One token's path (steps + 1, k) in (PC a, PC b) at x = its position, coloured by log step;
    ``with_scale`` draws the shared colour bar."""
    a, b = components
    n_steps = path.shape[0]
    steps = np.arange(n_steps)
    return go.Scatter3d(
        x=np.full(n_steps, position), y=path[:, a], z=path[:, b], mode="lines", name=label,
        line=dict(
            color=np.log2(steps + 1), colorscale=STEP_COLORSCALE, width=5,
            cmin=0, cmax=np.log2(n_steps), showscale=with_scale,
            colorbar=step_ticks if with_scale else None,
        ),
        text=[f"{label}<br>step {s}" for s in steps], hoverinfo="text",
    )  # fmt: skip


def waterfall_3d(
    coords: np.ndarray,
    tokens: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    components: tuple[int, int] = (0, 1),
    run: str | None = None,
    max_tokens: int = WATERFALL_MAX_TOKENS,
) -> go.Figure:
    """Every token's path in (PC a, PC b) stacked along the token position: a 3-D waterfall.

    One line per token, coloured by step on a log scale (one shared colour bar), its end marked; at most
    ``max_tokens`` evenly spaced positions when none are given, and a fixed camera looking along
    the positions, so the paths read as a row of curves rather than a point cloud."""
    coords = np.asarray(coords)
    if coords.ndim != 3:
        raise ValueError(f"coords must be (steps + 1, T, k), got shape {coords.shape}")
    n_steps, T = coords.shape[:2]
    labels = position_labels(tokens, T)
    if positions is None:
        positions = np.unique(np.linspace(0, T - 1, min(T, max_tokens)).round().astype(int))
    a, b = components
    step_ticks = _log_step_ticks(n_steps)
    fig = go.Figure()
    for i, p in enumerate(positions):
        fig.add_trace(_waterfall_line(coords[:, p], p, components, labels[p], step_ticks, i == 0))
    ends = np.asarray(list(positions))
    fig.add_trace(
        go.Scatter3d(
            x=ends, y=coords[-1, ends, a], z=coords[-1, ends, b], mode="markers",
            marker=dict(size=3, color="black"), name="last step",
            text=[labels[p] for p in ends], hoverinfo="text",
        )
    )  # fmt: skip
    shown = "" if len(ends) == T else f", {len(ends)} of {T} tokens"
    fig.update_layout(
        title=f"trajectories by token position{_of(run)}{shown}",
        showlegend=False,
        scene=dict(
            xaxis_title="token position", yaxis_title=f"PC{a + 1}", zaxis_title=f"PC{b + 1}",
            camera=WATERFALL_CAMERA, aspectmode="manual", aspectratio=dict(x=1.8, y=1, z=0.7),
        ),
        height=650,
        margin=dict(l=0, r=0, t=60, b=0),
    )  # fmt: skip
    return fig


def rotation_panel(
    token_states: np.ndarray, plane: np.ndarray, label: str = "", run: str | None = None
) -> go.Figure:
    """One token's path in a plane (2, h) of state space, centred, and its unwrapped angle per step.

    token_states: (steps + 1, h). plane: two vectors spanning the plane (orthonormalised here).
    The step colour bar stands beside the path panel it belongs to. run: e.g. "seed 0".
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
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("path in the plane", "angle (unwrapped)"),
        horizontal_spacing=0.2,
    )
    path_right = fig.layout.xaxis.domain[1]
    fig.add_trace(
        step_path(
            xy[:, 0], xy[:, 1], label or "token", showscale=True, colorbar_x=path_right + 0.01
        ),
        row=1,
        col=1,
    )
    fig.add_trace(go.Scatter(x=steps, y=angle, mode="lines+markers", name="angle"), row=1, col=2)
    fig.update_xaxes(title_text="u1", row=1, col=1)
    fig.update_yaxes(title_text="u2", scaleanchor="x", row=1, col=1)
    fig.update_xaxes(title_text="step", row=1, col=2)
    fig.update_yaxes(title_text="radians", row=1, col=2)
    fig.update_layout(showlegend=False, title=f"rotation {label}{_of(run)}".strip(), height=420)
    return fig
