"""Figures of ``workbench.corpus.compare``: one per table, each run's values side by side above each
later run's difference from the first with its bootstrap interval as error bars.

Every builder takes the frames ``compare`` returns and gives a ``go.Figure``; a table that is empty
(no λ_1 or no common lens step in the runs) draws a note saying so instead of empty axes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..corpus.compare import ABSENT, LEVEL
from .corpus import SEGMENTS

RUN_COLORS = qualitative.Safe
KIND_WORDS = {key: name for key, name, *_ in SEGMENTS}


def _note(text: str, title: str) -> go.Figure:
    """A figure holding one line of text (an empty table says why instead of drawing nothing)."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(title=title, height=300)
    return fig


def _runs(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table["run"]))


def _pick(table: pd.DataFrame, run: str, x: str, order: list[str], column: str) -> np.ndarray:
    """``column`` of ``run``'s rows in the order of ``order`` along ``x``."""
    rows = table[table["run"] == run].set_index(x)
    return rows[column].reindex(order).to_numpy(dtype=float)


def _difference_traces(
    fig: go.Figure, table: pd.DataFrame, x: str, order: list[str], labels: list[str], fmt: str
) -> None:
    """Row 2: each later run's difference from the first, the interval as asymmetric error bars."""
    runs = _runs(table)
    for i, run in enumerate(runs[1:], start=1):
        diff = _pick(table, run, x, order, "difference")
        low, high = _pick(table, run, x, order, "low"), _pick(table, run, x, order, "high")
        fig.add_trace(
            go.Scatter(
                x=labels, y=diff, mode="markers", name=f"{run} − {runs[0]}",
                marker=dict(color=RUN_COLORS[i % len(RUN_COLORS)], size=9, symbol="diamond"),
                error_y=dict(type="data", symmetric=False, array=high - diff,
                             arrayminus=diff - low, thickness=1.5),
                customdata=np.column_stack([low, high]),
                hovertemplate=f"%{{x}}<br>{run} − {runs[0]}: %{{y:{fmt}}}<br>{LEVEL:.0%} "
                f"interval %{{customdata[0]:{fmt}}} to %{{customdata[1]:{fmt}}}<extra></extra>",
            ),
            row=2, col=1,
        )  # fmt: skip
    fig.add_hline(y=0.0, line_dash="dot", line_color="grey", row=2, col=1)


def _two_rows(title: str, footer: str, top: str, bottom: str) -> go.Figure:
    """Values per run above, differences from the first run below; the footer under the axes."""
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4],
        subplot_titles=[top, bottom],
    )  # fmt: skip
    fig.update_layout(
        title=dict(text=title, x=0.02), barmode="group", height=600, margin=dict(t=110, b=100),
        legend=dict(orientation="h", yanchor="bottom", y=1.07, xanchor="left", x=0),
    )  # fmt: skip
    fig.add_annotation(
        text=footer, xref="paper", yref="paper", x=0, y=-0.1, yanchor="top", xanchor="left",
        align="left", showarrow=False, font=dict(size=11, color="#555"),
    )  # fmt: skip
    return fig


def _footer(frames: dict[str, pd.DataFrame]) -> str:
    pairs = frames["pairs"]
    unit = "prompts" if (pairs["unit"] == "prompt").any() else "token rows"
    return (
        f"over the {int(pairs['shared_by_all'].iloc[0])} prompts every run holds (statistics over "
        f"{unit})<br>error bars on Δ: {LEVEL:.0%} bootstrap interval, "
        f"{int(pairs['n_boot'].iloc[0])} resamples of prompts"
    )


def kind_shares_figure(frames: dict[str, pd.DataFrame], group: str = "all") -> go.Figure:
    """Grouped bars of each kind's share per run (``group``: all, or a source), and below them each
    later run's difference from the first with its bootstrap interval."""
    table = frames["kinds"]
    table = table[table["group"] == group]
    if table.empty:
        return _note(f"no kind shares for {group!r} in this comparison", "kinds compared")
    order = list(dict.fromkeys(table["statistic"]))
    labels = [KIND_WORDS.get(k, k) for k in order]
    fig = _two_rows(
        f"kind of each token trajectory ({group})", _footer(frames),
        "share per run", "difference from the first run",
    )  # fmt: skip
    for i, run in enumerate(_runs(table)):
        values = _pick(table, run, "statistic", order, "value")
        fig.add_trace(
            go.Bar(
                x=labels, y=values, name=run, marker_color=RUN_COLORS[i % len(RUN_COLORS)],
                text=[f"{v:.0%}" for v in values], textposition="outside",
                hovertemplate=f"{run}<br>%{{x}}: %{{y:.1%}}<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
    _difference_traces(fig, table, "statistic", order, labels, ".1%")
    fig.update_yaxes(title_text="share", tickformat=".0%", range=[0, 1.12], row=1, col=1)
    fig.update_yaxes(title_text="Δ share", tickformat=".0%", row=2, col=1)
    return fig


def _quantile_figure(
    frames: dict[str, pd.DataFrame], name: str, axis: str, title: str, fmt: str
) -> go.Figure:
    """Per group, each run's median as a bar with whiskers at the quartiles; below, the median's
    difference from the first run with its interval."""
    table = frames[name]
    if table.empty:
        return _note(ABSENT[name], title)
    order = list(dict.fromkeys(table["group"]))
    median = table[table["statistic"] == "median"]
    fig = _two_rows(title, _footer(frames), "median per run, whiskers at the quartiles",
                    "difference of the median from the first run")  # fmt: skip
    for i, run in enumerate(_runs(table)):
        values = _pick(median, run, "group", order, "value")
        q25 = _pick(table[table["statistic"] == "q25"], run, "group", order, "value")
        q75 = _pick(table[table["statistic"] == "q75"], run, "group", order, "value")
        never = table[table["statistic"] == "never"]
        extra = _pick(never, run, "group", order, "value") if len(never) else np.full_like(q25, 0)
        fig.add_trace(
            go.Bar(
                x=order, y=values, name=run, marker_color=RUN_COLORS[i % len(RUN_COLORS)],
                error_y=dict(type="data", symmetric=False, array=q75 - values,
                             arrayminus=values - q25, color="#444", thickness=1.5),
                customdata=np.column_stack([q25, q75, extra]),
                hovertemplate=f"{run}<br>%{{x}}: median %{{y:{fmt}}} (quartiles "
                f"%{{customdata[0]:{fmt}}} to %{{customdata[1]:{fmt}}})"
                + ("<br>never converged: %{customdata[2]:.1%}" if len(never) else "")
                + "<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
    _difference_traces(fig, median, "group", order, order, fmt)
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text=axis, row=1, col=1)
    fig.update_yaxes(title_text=f"Δ {axis}", row=2, col=1)
    return fig


def steps_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Steps to converge per run and group: median bars, quartile whiskers (the share that never
    converged in the hover), and the median's difference with its interval."""
    return _quantile_figure(frames, "steps", "steps to converge", "steps to converge", ".3g")


def lambda_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """λ_1 per run and group: median bars, quartile whiskers, the median's difference."""
    return _quantile_figure(frames, "lambda_1", "λ_1 (per step)", "largest Lyapunov exponent λ_1",
                            ".3g")  # fmt: skip


def lens_figure(frames: dict[str, pd.DataFrame], group: str = "all") -> go.Figure:
    """Median coda-lens KL at each lens step every run has, per run (log axis), and each later
    run's difference with its interval."""
    table = frames["lens"]
    table = table[table["group"] == group]
    title = "coda-lens KL to each run's final prediction (median)"
    if table.empty:
        return _note(ABSENT["lens"], title)
    order = list(dict.fromkeys(table["statistic"]))
    fig = _two_rows(f"{title}, {group}", _footer(frames), "median KL per run",
                    "difference from the first run")  # fmt: skip
    for i, run in enumerate(_runs(table)):
        fig.add_trace(
            go.Bar(
                x=order, y=_pick(table, run, "statistic", order, "value"), name=run,
                marker_color=RUN_COLORS[i % len(RUN_COLORS)],
                hovertemplate=f"{run}<br>%{{x}}: %{{y:.3g}} nats<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
    _difference_traces(fig, table, "statistic", order, order, ".3g")
    fig.update_yaxes(title_text="KL (nats)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="Δ KL (nats)", row=2, col=1)
    return fig


def comparison_figures(frames: dict[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Every figure of a comparison, by table name."""
    return {
        "kinds": kind_shares_figure(frames),
        "steps": steps_figure(frames),
        "lambda_1": lambda_figure(frames),
        "lens": lens_figure(frames),
    }
