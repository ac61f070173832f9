"""Shared plotting helpers: labels and the step colour scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative, sample_colorscale

from .._frames import shown_token

STEP_COLORSCALE = "Viridis"
# the words figures and the app show for the analyses' column names
VALUE_WORDS = {
    "final_prob": "probability of the final top token",
    "kl_to_final": "KL to the final distribution",
    "entropy": "entropy (nats)",
    "final_rank": "rank of the final top token",
    "distance_to_final": "distance to the final state",
    "relative_step": "relative step ‖s_i − s_i−1‖ / ‖s_i‖",
    "acceleration": "acceleration ‖Δ_i − Δ_i−1‖ / ‖s_i‖",
    "delta_norm": "step length ‖Δ_i‖",
    "delta_cosine": "cosine of successive steps",
    "spread": "spread between seeds",
    "attractor_distance": "attractor distance",
    "final_spread": "spread at the last step",
    "final_step_size": "last relative step",
    "restored": "share restored",
    "logit_diff": "logit difference",
    "logprob": "log-probability",
}


def words(name: str) -> str:
    """How a column or parameter name is shown: `VALUE_WORDS`, else its words unjoined."""
    return VALUE_WORDS.get(name, name.replace("_", " "))


def step_path(
    x: np.ndarray,
    y: np.ndarray,
    name: str,
    z: np.ndarray | None = None,
    showscale: bool = False,
    colorbar_x: float | None = None,
) -> go.Scatter | go.Scatter3d:
    """A path through successive steps: a thin grey line and markers coloured by step index."""
    steps = np.arange(len(x))
    marker = dict(
        color=steps,
        colorscale=STEP_COLORSCALE,
        size=5 if z is None else 3,
        showscale=showscale,
        colorbar=dict(title="step", x=colorbar_x) if showscale else None,
    )
    line = dict(color="rgba(120,120,120,0.5)", width=1)
    hover = [f"{name}<br>step {s}" for s in steps]
    if z is None:
        return go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            name=name,
            marker=marker,
            line=line,
            text=hover,
            hoverinfo="text+x+y",
        )
    return go.Scatter3d(
        x=x,
        y=y,
        z=z,
        mode="lines+markers",
        name=name,
        marker=marker,
        line=line,
        text=hover,
        hoverinfo="text",
    )


def sequential_colours(n: int, scale: str = STEP_COLORSCALE, span: float = 0.85) -> list[str]:
    """``n`` colours evenly along the first ``span`` of a sequential scale (Viridis' palest yellow
    left out: it vanishes on plotly's light background), first to last."""
    if n <= 0:
        return []
    return sample_colorscale(scale, [0.5] if n == 1 else [span * i / (n - 1) for i in range(n)])


def short_number(value: float) -> str:
    """A tick label with at most 3 significant digits: 0.000326 -> '3.26e-4', 2400 -> '2400'."""
    if value == 0 or not np.isfinite(value):
        return f"{value:g}"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e5:
        text = f"{value:.3g}"
        return f"{float(text):.0f}" if "e" in text else text  # 2.4e+03 -> 2400
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def log_axis(values: np.ndarray | list[float], title: str) -> dict:
    """A log axis with labels only where a reader needs them: the decades in range, plus 2 and 5
    within each when the data span less than two decades (plotly's default labels every minor tick)."""
    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data) & (data > 0)]
    axis: dict = dict(title=title, type="log")
    if data.size == 0:
        return axis
    low, high = np.floor(np.log10(data.min())), np.ceil(np.log10(data.max()))
    decades = 10.0 ** np.arange(low, high + 1)
    multiples = (1, 2, 5) if np.log10(data.max() / data.min()) < 2 else (1,)
    ticks = [
        d * m for d in decades for m in multiples if data.min() / 1.5 <= d * m <= data.max() * 1.5
    ]
    if len(ticks) < 2:
        ticks = [data.min(), data.max()]
    axis.update(
        tickvals=ticks, ticktext=[short_number(t) for t in ticks], minor=dict(showgrid=False)
    )
    return axis


LEGEND_TOP_K = 8


def token_lines(
    fig: go.Figure, frame: pd.DataFrame, value: str, top_k: int = LEGEND_TOP_K
) -> list[str]:
    """One line per token of a (position, step) frame; only the ``top_k`` tokens with the largest
    last value get a colour and a legend entry, the rest are thin grey lines named on hover (a
    legend of every token of a long prompt does not fit). Returns the legend's token labels."""
    last = frame.sort_values("step").groupby("position")[value].last()
    ranked = last.sort_values(ascending=False, na_position="last").index[:top_k]
    highlighted = list(ranked)
    palette = qualitative.Plotly
    legend = []
    for (pos, tok), group in frame.groupby(["position", "token"], sort=True):
        g = group.sort_values("step")
        label = f"{pos}: {shown_token(tok)}"[:40]
        shown = pos in highlighted
        line = (
            dict(color=palette[highlighted.index(pos) % len(palette)], width=2)
            if shown
            else dict(color="rgba(140,140,140,0.45)", width=1)
        )
        fig.add_trace(
            go.Scatter(
                x=g["step"], y=g[value], mode="lines", name=label, line=line, showlegend=shown,
                legendrank=100 + highlighted.index(pos) if shown else None,
                hovertemplate=f"{label}<br>step %{{x}}<br>{words(value)} %{{y:.3g}}<extra></extra>",
            )
        )  # fmt: skip
        if shown:
            legend.append(label)
    return legend


def log_colour(matrix: np.ndarray) -> tuple[np.ndarray, dict]:
    """log10 of ``matrix`` for a heatmap's colour (zeros shown at the smallest positive value, so an
    exact 0 reads as "at most this") and colour-bar ticks at the decades, labelled 1e-3 …"""
    positive = matrix[matrix > 0]
    floor = positive.min() if positive.size else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        colour = np.log10(np.where(matrix > 0, matrix, floor))
    finite = colour[np.isfinite(colour)]
    if not finite.size:
        return colour, {}
    ticks = np.arange(np.floor(finite.min()), np.ceil(finite.max()) + 1)
    return colour, dict(tickvals=ticks, ticktext=[f"1e{int(t)}" for t in ticks])
