"""Dynamics across training: the frame of ``workbench.checkpoint_series`` as four panels."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..dynamics import KINDS, LABELS
from ._style import log_axis, sequential_colours

KIND_COLORS = {
    "fixed_point": "#2a9d8f",
    "orbit": "#e76f51",
    "slider": "#e9c46a",
    "other": "#8d99ae",
    "converging": "#c4e8e3",  # the corpus figure's converging segment
}
REQUIRED = {"step", "depth", "loss", "spread", "token_correlation"} | {f"share_{k}" for k in KINDS}
LOSS_NOTE = (
    "left axis: loss on the analysed texts at each depth r; right axis (dotted): the run's logged "
    "training loss, a batch mean over other text and sampled depths, so the two levels differ"
)


def _require(frame: pd.DataFrame, columns: set[str]) -> None:
    missing = columns - set(frame.columns)
    if missing:
        raise ValueError(f"not a checkpoint_series frame: missing column(s) {sorted(missing)}")


def _step_ticks(steps: list[int]) -> dict:
    """An x-axis whose ticks are exactly the checkpoints' training steps."""
    return dict(title_text="training step", tickvals=steps, ticktext=[str(s) for s in steps])


def _loss_panel(fig: go.Figure, frame: pd.DataFrame) -> None:
    """Panel (1, 1): the texts' loss per depth (sequential colours) and the logged training loss on
    its own right-hand axis."""
    depths = sorted(frame["depth"].unique())
    for colour, depth in zip(sequential_colours(len(depths)), depths):
        part = frame[frame["depth"] == depth].sort_values("step")
        fig.add_trace(
            go.Scatter(
                x=part["step"], y=part["loss"], mode="lines+markers", name=f"r = {depth}",
                line=dict(color=colour), legendgroup="depth", legendgrouptitle_text="texts' loss",
            ),
            1, 1, secondary_y=False,
        )  # fmt: skip
    if "train_loss" in frame and frame["train_loss"].notna().any():
        logged = frame.drop_duplicates("step").sort_values("step")
        fig.add_trace(
            go.Scatter(
                x=logged["step"], y=logged["train_loss"], mode="lines+markers",
                name="training loss (logged)", line=dict(dash="dot", color="grey"),
                marker=dict(symbol="x", color="grey"), legendgroup="train",
            ),
            1, 1, secondary_y=True,
        )  # fmt: skip
        fig.update_yaxes(title_text="training loss (logged)", row=1, col=1, secondary_y=True,
                         showgrid=False, tickmode="auto", nticks=5, tickformat=".3~g")  # fmt: skip


def checkpoint_series_figure(frame: pd.DataFrame) -> go.Figure:
    """Loss per depth vs training step; dynamics shares; path-independence spread; token correlation.

    Every x tick is a checkpoint; the logged training loss has its own axis (see ``LOSS_NOTE``)."""
    _require(frame, REQUIRED)
    fig = make_subplots(
        rows=2,
        cols=2,
        specs=[[{"secondary_y": True}, {}], [{}, {}]],
        subplot_titles=(
            "loss at each depth r",
            "dynamics of all tokens",
            "spread of final states between seeds",
            "token correlation of final states",
        ),
        vertical_spacing=0.16,
    )
    _loss_panel(fig, frame)
    per_step = frame.drop_duplicates("step").sort_values("step")
    shown = [k for k in LABELS if f"share_{k}" in per_step]  # an older frame: no converging
    for kind in shown:
        fig.add_trace(
            go.Bar(
                x=per_step["step"], y=per_step[f"share_{kind}"], name=kind,
                marker_color=KIND_COLORS[kind], legendgroup="kinds",
                legendgrouptitle_text="dynamics",
            ),
            1, 2,
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(x=per_step["step"], y=per_step["spread"], mode="lines+markers", name="spread",
                   showlegend=False),
        2, 1,
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=per_step["step"], y=per_step["token_correlation"], mode="lines+markers",
            name="token correlation", showlegend=False,
        ),
        2, 2,
    )  # fmt: skip
    steps = [int(s) for s in per_step["step"]]
    fig.update_layout(barmode="stack", height=720, title="dynamics across training",
                      margin=dict(b=120), legend=dict(traceorder="grouped"))  # fmt: skip
    fig.add_annotation(text=LOSS_NOTE.replace("; ", ";<br>", 1), xref="paper", yref="paper", x=0, y=-0.16, showarrow=False,
                       xanchor="left", font=dict(size=11, color="#555"))  # fmt: skip
    for row, col in ((1, 1), (1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(_step_ticks(steps), row=row, col=col)
    fig.update_yaxes(title_text="loss (nats/token)", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="share of tokens", range=[0, 1], row=1, col=2)
    fig.update_yaxes(log_axis(per_step["spread"], "relative spread"), row=2, col=1)
    fig.update_yaxes(title_text="mean correlation", row=2, col=2)
    return fig


def loss_by_depth_figure(frame: pd.DataFrame) -> go.Figure:
    """Loss vs recurrence depth, one line per checkpoint on a sequential colour scale (early light,
    late dark), ticks at the measured depths."""
    _require(frame, {"step", "depth", "loss"})
    steps = sorted(frame["step"].unique())
    depths = sorted(int(d) for d in frame["depth"].unique())
    fig = go.Figure()
    for colour, step in zip(sequential_colours(len(steps))[::-1], steps):
        part = frame[frame["step"] == step].sort_values("depth")
        fig.add_trace(
            go.Scatter(
                x=part["depth"], y=part["loss"], mode="lines+markers", name=f"step {step}",
                line=dict(color=colour, width=2), marker=dict(color=colour, size=7),
            )
        )  # fmt: skip
    fig.update_layout(
        title="loss vs recurrence depth at each checkpoint",
        xaxis=dict(
            title="recurrence steps r", type="log", tickvals=depths,
            ticktext=[str(d) for d in depths], minor=dict(showgrid=False),
        ),
        yaxis_title="loss on the analysed texts (nats/token)",
        legend_title_text="checkpoint",
        height=420,
    )  # fmt: skip
    return fig
