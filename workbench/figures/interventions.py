"""Figures of the intervention tools: the patching heatmap, a steering sweep and the ablation control."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .._frames import shown_token
from ._style import short_number, words

KL_COLOUR, DELTA_COLOUR = "#1f77b4", "#d62728"


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
    gap_note = _gap_note(frame)
    if "gap_too_small" in frame.columns and bool(frame["gap_too_small"].any()):
        return _gap_too_small_figure(frame, gap_note, title)
    table = frame.pivot(index="position", columns="step", values=value).sort_index()
    tokens = frame.drop_duplicates("position").set_index("position").token
    labels = [
        "all positions" if p < 0 else f"{p}: {shown_token(tokens[p])}"[:40]
        for p in table.index.to_list()
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
            colorbar=dict(title=words(value)),
            hovertemplate="%{y}<br>step %{x}<br>" + words(value) + " %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=dict(
            text=(title or f"Activation patching: {words(value)} per patched position and step")
            + (f"<br><sup>{gap_note}</sup>" if gap_note else "")
        ),
        xaxis=dict(title="step", type="category"),
        yaxis=dict(title="patched position", autorange="reversed", type="category"),
        height=max(360, 24 * len(labels) + 160),
    )
    return fig


def _gap_note(frame: pd.DataFrame) -> str:
    """One line with the unpatched runs' scores and their gap, when the frame carries them."""
    if not {"clean", "corrupted"} <= set(frame.columns) or frame.empty:
        return ""
    clean, corrupted = float(frame["clean"].iloc[0]), float(frame["corrupted"].iloc[0])
    metric = words(frame.attrs.get("metric", "m"))
    return f"{metric}: clean {clean:.3g}, corrupted {corrupted:.3g}, gap {clean - corrupted:.3g}"


def _gap_too_small_figure(frame: pd.DataFrame, gap_note: str, title: str | None) -> go.Figure:
    """No colour scale when the clean and corrupted runs score the target alike: a ratio over that
    gap is noise, so the figure says so and shows the gap instead."""
    min_gap = frame.attrs.get("min_gap")
    limit = f" (below {min_gap:g})" if min_gap is not None else ""
    fig = go.Figure()
    fig.add_annotation(
        text=f"{gap_note}{limit}:<br>the clean and corrupted runs score the target alike, so "
        "'restored' divides noise by noise.<br>Pick a corrupted prompt that changes the answer.",
        x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14),
    )  # fmt: skip
    fig.update_layout(
        title=title or "Activation patching: gap too small to normalise",
        xaxis=dict(visible=False),
        yaxis=dict(visible=False),
        height=300,
        plot_bgcolor="white",
    )
    return fig


def steering_sweep_figure(frame: pd.DataFrame, title: str | None = None) -> go.Figure:
    """KL(baseline ‖ steered) and the target log-probability change against α (a `steering_sweep`
    frame); hover shows the steered top token."""
    _need(frame, ("alpha", "kl", "logprob_change", "top_token"), "steering_sweep_figure")
    fig = go.Figure()
    text = [f"top token {shown_token(t)}" for t in frame.top_token]
    fig.add_scatter(
        x=frame.alpha, y=frame.kl, mode="lines+markers", name="KL", text=text,
        line=dict(color=KL_COLOUR),
    )  # fmt: skip
    fig.add_scatter(
        x=frame.alpha,
        y=frame.logprob_change,
        mode="lines+markers",
        name="Δ log p(target)",
        yaxis="y2",
        line=dict(color=DELTA_COLOUR),
        text=text,
    )
    fig.update_layout(
        title=title or "Steering: effect on the next-token distribution",
        xaxis=dict(title="α", tickformat=_tick_format(frame.alpha)),
        yaxis=dict(
            title="KL(baseline ‖ steered)", tickformat=_tick_format(frame.kl), color=KL_COLOUR
        ),
        height=440,
        yaxis2=dict(
            title="Δ log p(target)", overlaying="y", side="right",
            tickformat=_tick_format(frame.logprob_change), showgrid=False, tickmode="auto",
            color=DELTA_COLOUR,
        ),
        legend=dict(orientation="h", x=0, y=1.02, xanchor="left", yanchor="bottom"),
        margin=dict(t=100),
    )  # fmt: skip
    return fig


def _tick_format(values: pd.Series) -> str:
    """A d3 tick format with at most 3 significant digits: exponent notation for values whose
    magnitude is below 0.01 or above 1e5 (plotly's default writes 0.000326…)."""
    finite = np.abs(values.to_numpy(dtype=float))
    finite = finite[np.isfinite(finite) & (finite > 0)]
    if finite.size and (finite.max() < 1e-2 or finite.max() >= 1e5):
        return ".2~e"
    return ".3~g"


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
        annotation_text=f"ablated subspace {short_number(float(real[0]))}",
    )
    fig.update_layout(
        title=title or "Ablation: the subspace's effect against random subspaces",
        xaxis_title="mean KL(baseline ‖ ablated) from the ablated position on",
        yaxis_title="count",
        showlegend=True,
    )
    return fig
