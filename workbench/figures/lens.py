"""Lens figures: a tokens × steps heatmap of a lens quantity, and a per-token top-k table."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .._frames import shown_token
from ._style import log_colour, short_number, words
from .convergence import frame_matrix

LOG_VALUES = ("final_rank", "kl_to_final")


def lens_heatmap(
    frame: pd.DataFrame, value: str = "final_prob", title: str | None = None
) -> go.Figure:
    """Heatmap of a ``lens`` column (final_prob, final_rank, kl_to_final, entropy) per token and step.

    Each cell shows the lens's top-1 token. With a ``sublayer`` column, rows are (step, sublayer).
    final_rank and kl_to_final are coloured on a log scale (KL spans many decades; its exact 0 at
    the last step shows at the smallest positive value).
    """
    frame = frame.copy()
    if "sublayer" in frame.columns:
        n_sub = int(frame["sublayer"].max()) + 1
        frame["step"] = frame["step"] + frame["sublayer"] / n_sub
    matrix, labels, steps = frame_matrix(frame, value)
    top1 = frame.pivot(index="position", columns="step", values="top1_token").sort_index()
    top1 = top1.map(lambda t: shown_token(t) if isinstance(t, str) else "")
    colorbar: dict = dict(title=words(value))
    colour = matrix
    if value in LOG_VALUES:
        colour, ticks = log_colour(matrix)
        colorbar.update(ticks, title=f"{words(value)} (log scale)")
    fig = go.Figure(
        go.Heatmap(
            z=colour,
            x=steps,
            y=labels,
            text=top1.to_numpy(),
            texttemplate="%{text}" if matrix.size <= 600 else None,
            customdata=matrix,
            colorscale="Viridis",
            reversescale=value in ("kl_to_final", "entropy", "final_rank"),
            colorbar=colorbar,
            hovertemplate="%{y}<br>step %{x}<br>top-1 %{text}<br>"
            + words(value)
            + " %{customdata:.4g}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or f"lens: {words(value)} (each cell: the lens's top token)",
        xaxis_title="step",
        yaxis=dict(title="token", autorange="reversed", type="category"),
        height=max(300, 22 * len(labels) + 120),
    )
    return fig


def lens_table(frame: pd.DataFrame, position: int) -> go.Figure:
    """The lens's top-k tokens (with probabilities) per step for one position, as a table."""
    rows = frame[frame["position"] == position].sort_values(
        [c for c in ("step", "sublayer") if c in frame.columns]
    )
    if rows.empty:
        raise ValueError(f"no lens rows for position {position}")
    step = rows["step"].astype(str)
    if "sublayer" in rows.columns:
        step = step + "." + rows["sublayer"].astype(str)
    topk = [
        ", ".join(f"{shown_token(t)} {short_number(float(p))}" for t, p in zip(ts, ps))
        for ts, ps in zip(rows["topk_tokens"], rows["topk_probs"])
    ]
    header = ["step", "top-k (prob)", "final rank", "final prob", "KL to final", "entropy"]
    cells = [
        step,
        topk,
        rows["final_rank"],
        *(
            [short_number(float(v)) for v in rows[c]]
            for c in ("final_prob", "kl_to_final", "entropy")
        ),
    ]
    fig = go.Figure(
        go.Table(
            header=dict(values=header, align="left"),
            cells=dict(values=cells, align=["left", "left", "right", "right", "right", "right"]),
            columnwidth=[0.7, 5, 1, 1, 1.1, 1],
        )
    )
    token = rows["token"].iloc[0]
    fig.update_layout(
        title=f"lens for position {position}: {shown_token(token)} (3 significant digits)",
        height=min(900, 120 + 26 * len(rows)),
        margin=dict(l=10, r=10),
    )
    return fig
