"""Two models on one prompt, side by side: their convergence heatmaps on one colour scale, each
token's dynamics kind in one strip per model, and both trajectories in one PCA.

Every builder takes the frames and arrays the workbench gives for each model (``convergence``,
``classify_dynamics`` kinds, ``project`` coordinates) and the two models' names. ``aligned`` says
the two share their tokens (one tokenizer): then the token axes are shared; otherwise each model
keeps its own token labels and the figures say so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .._frames import position_labels
from ._style import log_colour, step_path, words
from .convergence import frame_matrix
from .training import KIND_COLORS

KIND_ORDER = ("fixed_point", "converging", "orbit", "slider", "other")
NOT_ALIGNED = "the tokenizers split the prompt differently: each panel has its own tokens"
ROW_PX = 18  # height of one token row in the heatmaps


def _pair(names: Sequence[str]) -> tuple[str, str]:
    if len(names) != 2:
        raise ValueError(f"give two model names, got {list(names)}")
    return str(names[0]), str(names[1])


def convergence_pair(
    frame_a: pd.DataFrame,
    frame_b: pd.DataFrame,
    names: Sequence[str],
    value: str = "distance_to_final",
    aligned: bool = True,
) -> go.Figure:
    """The two models' convergence heatmaps (tokens × steps) side by side on one log10 colour
    scale (the range of both), token rows shared when ``aligned``."""
    name_a, name_b = _pair(names)
    (m_a, labels_a, steps_a), (m_b, labels_b, steps_b) = (
        frame_matrix(frame_a, value),
        frame_matrix(frame_b, value),
    )
    both, ticks = log_colour(np.concatenate([m_a.ravel(), m_b.ravel()]))
    colour_a, colour_b = both[: m_a.size].reshape(m_a.shape), both[m_a.size :].reshape(m_b.shape)
    finite = both[np.isfinite(both)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    fig = make_subplots(
        rows=1, cols=2, shared_yaxes=aligned, horizontal_spacing=0.04 if aligned else 0.12,
        subplot_titles=[name_a, name_b],
    )  # fmt: skip
    for col, (colour, matrix, labels, steps) in enumerate(
        ((colour_a, m_a, labels_a, steps_a), (colour_b, m_b, labels_b, steps_b)), start=1
    ):
        fig.add_trace(
            go.Heatmap(
                z=colour, x=steps, y=labels, customdata=matrix, colorscale="Viridis",
                zmin=low, zmax=high, showscale=col == 2,
                colorbar=dict(title=words(value), **ticks),
                hovertemplate="%{y}<br>step %{x}<br>" + words(value)
                + " %{customdata:.4g}<extra></extra>",
            ),
            row=1, col=col,
        )  # fmt: skip
        fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=col)
    fig.update_yaxes(title_text="token", row=1, col=1)
    rows = max(len(labels_a), len(labels_b))
    title = f"{words(value)} per token and step (log scale, one colour scale)"
    fig.update_layout(
        title=title if aligned else f"{title}<br><sup>{NOT_ALIGNED}</sup>",
        height=max(320, ROW_PX * rows + 140),
    )
    return fig


def _kind_codes(kinds: Sequence[str]) -> np.ndarray:
    unknown = sorted(set(kinds) - set(KIND_ORDER))
    if unknown:
        raise ValueError(f"unknown dynamics kinds {unknown}; expected {list(KIND_ORDER)}")
    return np.array([KIND_ORDER.index(k) for k in kinds], dtype=float)


def _kind_scale() -> list[tuple[float, str]]:
    """A stepped colour scale: code i (0 … 4) in KIND_COLORS of KIND_ORDER[i]."""
    n = len(KIND_ORDER)
    scale = []
    for i, kind in enumerate(KIND_ORDER):
        scale += [(i / n, KIND_COLORS[kind]), ((i + 1) / n, KIND_COLORS[kind])]
    return scale


def kinds_pair(
    kinds_a: Sequence[str],
    kinds_b: Sequence[str],
    tokens_a: Sequence[str],
    tokens_b: Sequence[str],
    names: Sequence[str],
    aligned: bool = True,
) -> go.Figure:
    """Each token's dynamics kind (fixed_point, converging, orbit, slider, other) as a coloured
    cell: one strip per model, tokens along x (shared when ``aligned``), kinds in the legend."""
    name_a, name_b = _pair(names)
    if len(kinds_a) != len(tokens_a) or len(kinds_b) != len(tokens_b):
        raise ValueError("give one kind per token for each model")
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=aligned, vertical_spacing=0.12 if aligned else 0.3,
        subplot_titles=[name_a, name_b],
    )  # fmt: skip
    for row, (kinds, tokens, name) in enumerate(
        ((kinds_a, tokens_a, name_a), (kinds_b, tokens_b, name_b)), start=1
    ):
        labels = position_labels(list(tokens), len(tokens))
        words_ = [k.replace("_", " ") for k in kinds]
        fig.add_trace(
            go.Heatmap(
                z=_kind_codes(kinds)[None, :], x=labels, y=[name], zmin=0, zmax=len(KIND_ORDER),
                colorscale=_kind_scale(), showscale=False, xgap=2,
                text=[words_], hovertemplate="%{x}<br>" + name + ": %{text}<extra></extra>",
            ),
            row=row, col=1,
        )  # fmt: skip
        fig.update_xaxes(type="category", tickangle=-60, row=row, col=1)
        fig.update_yaxes(showticklabels=False, row=row, col=1)
    for kind in KIND_ORDER:  # the legend: one square per kind
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", name=kind.replace("_", " "),
                marker=dict(symbol="square", size=12, color=KIND_COLORS[kind]),
            )
        )  # fmt: skip
    title = "dynamics kind of each token"
    fig.update_layout(
        title=title if aligned else f"{title}<br><sup>{NOT_ALIGNED}</sup>",
        height=360 if aligned else 420,
        legend=dict(orientation="h", yanchor="bottom", y=1.12, xanchor="left", x=0),
        margin=dict(t=110),
    )
    return fig


def joint_pca_pair(
    coords_a: np.ndarray,
    coords_b: np.ndarray,
    tokens_a: Sequence[str],
    tokens_b: Sequence[str],
    names: Sequence[str],
    explained_variance: Sequence[float] | None = None,
    joint: bool = True,
) -> go.Figure:
    """Both trajectories (steps + 1, T, ≥ 2) in PC1 / PC2, side by side on the same axes: every
    token's path coloured by step. ``joint``: the coordinates come from one PCA fitted on both
    models' states together (so the panels share a space); else each from its own PCA, and the
    axes are not shared."""
    name_a, name_b = _pair(names)
    for coords in (coords_a, coords_b):
        if np.ndim(coords) != 3 or np.shape(coords)[-1] < 2:
            raise ValueError(f"coords must be (steps + 1, T, k >= 2), got {np.shape(coords)}")
    fig = make_subplots(
        rows=1, cols=2, shared_yaxes=joint, subplot_titles=[name_a, name_b],
        horizontal_spacing=0.06 if joint else 0.1,
    )  # fmt: skip
    if joint:  # one space: both panels on the same x range too
        fig.update_xaxes(matches="x", row=1, col=2)
    last_step = max(coords_a.shape[0], coords_b.shape[0]) - 1  # one step colour scale for both
    for col, (coords, tokens) in enumerate(((coords_a, tokens_a), (coords_b, tokens_b)), start=1):
        labels = position_labels(list(tokens), coords.shape[1])
        for p, label in enumerate(labels):
            trace = step_path(
                coords[:, p, 0], coords[:, p, 1], label, showscale=col == 2 and p == 0
            )
            trace.marker.update(cmin=0, cmax=last_step)
            fig.add_trace(trace, row=1, col=col)
        fig.add_trace(
            go.Scatter(
                x=coords[-1, :, 0], y=coords[-1, :, 1], mode="text", text=labels,
                textposition="top center", textfont=dict(size=9, color="#444"),
                hoverinfo="skip",
            ),
            row=1, col=col,
        )  # fmt: skip

    def axis(c: int) -> str:
        ev = explained_variance
        return f"PC{c + 1}" + (f" ({100 * ev[c]:.1f}%)" if ev is not None else "")

    for col in (1, 2):
        fig.update_xaxes(title_text=axis(0) if joint else "PC1", row=1, col=col)
    fig.update_yaxes(title_text=axis(1) if joint else "PC2", row=1, col=1)
    title = (
        "both trajectories in one PCA (fitted on both models' states), tokens labelled at the "
        "last step"
        if joint
        else "each trajectory in its own PCA (the hidden sizes differ: no common space)"
    )
    fig.update_layout(title=title, showlegend=False, height=560)
    return fig
