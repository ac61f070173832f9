"""Dynamics across training: the frame of ``workbench.checkpoint_series`` as four panels."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..dynamics import KINDS

KIND_COLORS = {
    "fixed_point": "#2a9d8f",
    "orbit": "#e76f51",
    "slider": "#e9c46a",
    "other": "#8d99ae",
}
REQUIRED = {"step", "depth", "loss", "spread", "token_correlation"} | {f"share_{k}" for k in KINDS}


def checkpoint_series_figure(frame: pd.DataFrame) -> go.Figure:
    """Loss per depth vs training step; dynamics shares; path-independence spread; token correlation."""
    missing = REQUIRED - set(frame.columns)
    if missing:
        raise ValueError(f"not a checkpoint_series frame: missing column(s) {sorted(missing)}")
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "loss at each depth r",
            "dynamics of all tokens",
            "spread of final states between seeds",
            "token correlation of final states",
        ),
    )
    for depth, part in frame.groupby("depth"):
        fig.add_trace(
            go.Scatter(x=part["step"], y=part["loss"], mode="lines+markers", name=f"r = {depth}"),
            1,
            1,
        )
    if "train_loss" in frame and frame["train_loss"].notna().any():
        logged = frame.drop_duplicates("step")
        fig.add_trace(
            go.Scatter(
                x=logged["step"], y=logged["train_loss"], mode="lines", name="train loss (logged)",
                line=dict(dash="dot", color="grey"),
            ),
            1,
            1,
        )  # fmt: skip
    per_step = frame.drop_duplicates("step").sort_values("step")
    for kind in KINDS:
        fig.add_trace(
            go.Bar(
                x=per_step["step"], y=per_step[f"share_{kind}"], name=kind,
                marker_color=KIND_COLORS[kind],
            ),
            1,
            2,
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(x=per_step["step"], y=per_step["spread"], mode="lines+markers", name="spread"),
        2,
        1,
    )
    fig.add_trace(
        go.Scatter(
            x=per_step["step"], y=per_step["token_correlation"], mode="lines+markers",
            name="token correlation",
        ),
        2,
        2,
    )  # fmt: skip
    fig.update_layout(barmode="stack", height=640, title="dynamics across training")
    for row, col in ((1, 1), (1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(title_text="training step", row=row, col=col)
    fig.update_yaxes(title_text="loss (nats/token)", row=1, col=1)
    fig.update_yaxes(title_text="share of tokens", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="relative spread", type="log", row=2, col=1)
    fig.update_yaxes(title_text="mean correlation", row=2, col=2)
    return fig


def loss_by_depth_figure(frame: pd.DataFrame) -> go.Figure:
    """Loss vs recurrence depth, one line per checkpoint (later steps darker)."""
    missing = {"step", "depth", "loss"} - set(frame.columns)
    if missing:
        raise ValueError(f"not a checkpoint_series frame: missing column(s) {sorted(missing)}")
    steps = sorted(frame["step"].unique())
    fig = go.Figure()
    for i, step in enumerate(steps):
        part = frame[frame["step"] == step].sort_values("depth")
        shade = 0.25 + 0.75 * (i + 1) / len(steps)
        fig.add_trace(
            go.Scatter(
                x=part["depth"], y=part["loss"], mode="lines+markers", name=f"step {step}",
                line=dict(color=f"rgba(38, 70, 83, {shade:.2f})"),
            )
        )  # fmt: skip
    fig.update_layout(
        title="loss vs recurrence depth at each checkpoint",
        xaxis=dict(title="recurrence steps r", type="log"),
        yaxis_title="loss (nats/token)",
        height=420,
    )
    return fig
