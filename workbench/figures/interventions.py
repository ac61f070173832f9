"""Figures of the intervention tools: the patching heatmap, a steering sweep and the ablation control."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


def _need(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the frame has {list(frame.columns)}")


def patching_heatmap(
    frame: pd.DataFrame, value: str = "restored", title: str | None = None
) -> go.Figure:
    """Positions × steps heatmap of a `patch_states` frame (position −1 = every position at once),
    diverging colour centred on 0 with 1 = fully restored."""
    _need(frame, ("position", "step", "token", value), "patching_heatmap")
    table = frame.pivot(index="position", columns="step", values=value).sort_index()
    tokens = frame.drop_duplicates("position").set_index("position").token
    labels = [
        "all positions" if p < 0 else f"{p}: {tokens[p]!r}"[:40] for p in table.index.to_list()
    ]
    matrix = table.to_numpy(dtype=float)
    finite = matrix[np.isfinite(matrix)]
    span = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    steps = table.columns.to_numpy()
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=[str(s) if s >= 0 else "once" for s in steps],
            y=labels,
            zmin=-span,
            zmax=span,
            colorscale="RdBu",
            reversescale=True,
            colorbar=dict(title=value),
            hovertemplate="%{y}<br>step %{x}<br>" + value + " %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or f"Activation patching: {value} per patched position and step",
        xaxis=dict(title="step", type="category"),
        yaxis=dict(title="patched position", autorange="reversed", type="category"),
        height=max(300, 18 * len(labels) + 120),
    )
    return fig


def steering_sweep_figure(frame: pd.DataFrame, title: str | None = None) -> go.Figure:
    """KL(baseline ‖ steered) and the target log-probability change against α (a `steering_sweep`
    frame); hover shows the steered top token."""
    _need(frame, ("alpha", "kl", "logprob_change", "top_token"), "steering_sweep_figure")
    fig = go.Figure()
    text = [f"top token {t!r}" for t in frame.top_token]
    fig.add_scatter(x=frame.alpha, y=frame.kl, mode="lines+markers", name="KL", text=text)
    fig.add_scatter(
        x=frame.alpha,
        y=frame.logprob_change,
        mode="lines+markers",
        name="Δ log p(target)",
        yaxis="y2",
        text=text,
    )
    fig.update_layout(
        title=title or "Steering: effect on the next-token distribution",
        xaxis_title="α",
        yaxis=dict(title="KL(baseline ‖ steered)"),
        yaxis2=dict(title="Δ log p(target)", overlaying="y", side="right"),
        legend=dict(x=0.01, y=0.99),
    )
    return fig


def ablation_control_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Histogram of the random-subspace effects with the real subspace's effect marked (the
    ``table`` of an `AblationResult`)."""
    _need(table, ("kind", "effect"), "ablation_control_figure")
    real = table.effect[table.kind == "real"].to_numpy()
    control = table.effect[table.kind == "random"].to_numpy()
    if real.size != 1 or control.size == 0:
        raise ValueError("the table needs one 'real' row and at least one 'random' row")
    fig = go.Figure(go.Histogram(x=control, name=f"{control.size} random subspaces", nbinsx=20))
    fig.add_vline(
        x=float(real[0]),
        line=dict(color="crimson", width=3),
        annotation_text=f"ablated subspace {real[0]:.3g}",
    )
    fig.update_layout(
        title=title or "Ablation: the subspace's effect against random subspaces",
        xaxis_title="mean KL(baseline ‖ ablated) from the ablated position on",
        yaxis_title="count",
        showlegend=True,
    )
    return fig
