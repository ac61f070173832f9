"""Corpus figures: the tables of ``workbench.corpus.summary`` as kind shares, the orbit period
histogram, steps to converge with their quartiles and λ_1 quantiles.

Every builder takes one summary table (a DataFrame or Series) and returns a ``go.Figure``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..corpus.summary import PERIOD_CAP
from .training import KIND_COLORS

# (segment, label, colour, hatch, text colour): settled fixed points and converging ones are
# separate segments; converging is the fixed-point teal, lighter and hatched (still on its way)
SEGMENTS = (
    ("settled", "fixed point (settled)", KIND_COLORS["fixed_point"], "", "white"),
    ("converging", "converging", "#c4e8e3", "/", "#123"),
    ("orbit", "orbit", KIND_COLORS["orbit"], "", "white"),
    ("slider", "slider", KIND_COLORS["slider"], "", "#123"),
    ("other", "other", KIND_COLORS["other"], "", "white"),
)
SHARE_COLUMNS = ("fixed_point", "converging", "orbit", "slider", "other", "tokens")
STEP_COLUMNS = ("median", "q25", "q75", "never", "tokens")
LAMBDA_COLUMNS = ("q05", "q25", "q50", "q75", "q95")
MIN_LABELLED_SHARE = 0.08  # bar segments below this share carry no text (it would not fit)


def _require(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the table has {list(frame.columns)}")


def kind_segments(table: pd.DataFrame) -> pd.DataFrame:
    """The shares of a summary shares table as stacked segments that add up to 1: ``fixed_point``
    (which counts converging tokens too) split into ``settled`` and ``converging``."""
    _require(table, SHARE_COLUMNS, "kind_segments")
    out = table[["converging", "orbit", "slider", "other"]].astype(float).copy()
    out.insert(0, "settled", (table["fixed_point"] - table["converging"]).clip(lower=0.0))
    return out


def kind_share_bars(table: pd.DataFrame, by: str = "source", title: str | None = None) -> go.Figure:
    """Stacked bars of each kind's share per row of a summary shares table (``by_source``,
    ``by_category``, ...), one bar per row labelled with its token count."""
    segments = kind_segments(table)
    labels = [f"{name}<br>{int(n):,} tokens" for name, n in zip(table.index, table["tokens"])]
    fig = go.Figure()
    for key, name, colour, hatch, ink in SEGMENTS:
        values = segments[key].to_numpy()
        fig.add_trace(
            go.Bar(
                x=labels, y=values, name=name,
                marker=dict(color=colour, pattern=dict(shape=hatch, fgcolor="#7cc4ba", solidity=0.25)),
                text=[f"{v:.0%}" if v >= MIN_LABELLED_SHARE else "" for v in values],
                textposition="inside", insidetextanchor="middle", textfont=dict(color=ink),
                hovertemplate=f"%{{x}}<br>{name}: %{{y:.1%}}<extra></extra>",
            )
        )  # fmt: skip
    fig.update_layout(
        barmode="stack",
        title=dict(text=title or f"kind of each token trajectory by {by}", y=0.98, yanchor="top"),
        xaxis=dict(title=by, type="category"),
        yaxis=dict(title="share of trajectories", range=[0, 1], tickformat=".0%"),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0,
                    traceorder="normal"),
        uniformtext=dict(minsize=9, mode="hide"),
        margin=dict(t=110),
        height=460,
    )  # fmt: skip
    return fig


def period_histogram_figure(periods: pd.Series, cap: int = PERIOD_CAP) -> go.Figure:
    """Orbits by period in steps (the summary's ``periods``: count per rounded period, ``cap``
    standing for ≥ cap); a run without orbits says so."""
    periods = periods.sort_index()
    fig = go.Figure()
    total = int(periods.sum())
    if total == 0:
        fig.add_annotation(
            text="no orbits in this run", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
    else:
        labels = [f"≥{p}" if p >= cap else str(p) for p in periods.index]
        fig.add_trace(
            go.Bar(
                x=labels, y=periods.to_numpy(), marker_color=KIND_COLORS["orbit"],
                hovertemplate="period %{x} steps<br>%{y} orbiting trajectories<extra></extra>",
            )
        )  # fmt: skip
        fig.update_xaxes(title="period (steps)", type="category")
        fig.update_yaxes(title="orbiting trajectories")
    fig.update_layout(title=f"orbit periods ({total:,} orbiting trajectories)", height=380)
    return fig


def _steps_bars(table: pd.DataFrame) -> go.Bar:
    """Median steps per row with its quartiles as whiskers; the share that never converged under
    the row's name."""
    median = table["median"].to_numpy(dtype=float)
    never = table["never"].to_numpy(dtype=float)
    custom = np.column_stack([table["q25"], table["q75"], never, table["tokens"]])
    labels = [f"{i}<br>never {v:.0%}" if v > 0 else str(i) for i, v in zip(table.index, never)]
    return go.Bar(
        x=labels, y=median, marker_color=KIND_COLORS["fixed_point"],
        error_y=dict(type="data", symmetric=False, array=table["q75"] - median,
                     arrayminus=median - table["q25"], color="#444", thickness=1.5),
        customdata=custom, showlegend=False,
        hovertemplate="%{x}<br>median %{y:g} steps (quartiles %{customdata[0]:g} to "
        "%{customdata[1]:g})<br>never converged: %{customdata[2]:.1%} of %{customdata[3]:,} "
        "tokens<extra></extra>",
    )  # fmt: skip


def convergence_steps_figure(
    by_source: pd.DataFrame, by_difficulty: pd.DataFrame | None = None
) -> go.Figure:
    """Steps to converge (median bar, quartile whiskers) by source, and by task difficulty
    (``source:level``) beside it when the run has difficulties; the share that never converged
    is written under each name (the quartiles count only the tokens that did)."""
    _require(by_source, STEP_COLUMNS, "convergence_steps_figure")
    tables = [("by source", by_source)]
    if by_difficulty is not None and len(by_difficulty):
        _require(by_difficulty, STEP_COLUMNS, "convergence_steps_figure")
        tables.append(("by difficulty (source:level)", by_difficulty))
    widths = [len(t) + 1 for _, t in tables]
    fig = make_subplots(
        rows=1, cols=len(tables), subplot_titles=[name for name, _ in tables],
        column_widths=[w / sum(widths) for w in widths], horizontal_spacing=0.08,
    )  # fmt: skip
    for col, (_, table) in enumerate(tables, start=1):
        fig.add_trace(_steps_bars(table), 1, col)
        fig.update_xaxes(type="category", tickangle=-30, row=1, col=col)
    top = max(float(np.nanmax(t["q75"].to_numpy(dtype=float), initial=0.0)) for _, t in tables)
    fig.update_yaxes(title_text="steps to converge", row=1, col=1)
    fig.update_yaxes(range=[0, 1.15 * top if top > 0 else 1])
    fig.update_layout(
        title="steps to converge: median, whiskers at the quartiles", height=420, bargap=0.35
    )
    return fig


def lambda_quantiles_figure(table: pd.DataFrame) -> go.Figure:
    """λ_1 per source from the summary's ``lambda_1`` quantiles: box at the quartiles, whiskers at
    5 % and 95 %, a dotted line at 0 (neutral); the neutral and positive shares under each name."""
    _require(table, LAMBDA_COLUMNS, "lambda_quantiles_figure")
    labels = []
    for name, row in table.iterrows():
        extra = [
            f"{k} {row[k]:.0%}" for k in ("neutral", "positive") if k in row and pd.notna(row[k])
        ]
        labels.append(f"{name}<br>{' · '.join(extra)}" if extra else str(name))
    fig = go.Figure(
        go.Box(
            x=labels, q1=table["q25"], median=table["q50"], q3=table["q75"],
            lowerfence=table["q05"], upperfence=table["q95"], name="λ_1",
            marker_color=KIND_COLORS["orbit"], showlegend=False,
        )
    )  # fmt: skip
    fig.add_hline(y=0.0, line_dash="dot", line_color="grey", annotation_text="λ_1 = 0")
    fig.update_layout(
        title="largest Lyapunov exponent λ_1 per token: quartiles, whiskers at 5 % and 95 %",
        xaxis=dict(title="source", type="category"),
        yaxis=dict(title="λ_1 (per step)", tickformat=".3~g"),
        height=420,
    )
    return fig
