"""Stability figures: eigenvalues against the unit circle, Lyapunov bars, the running λ_1, the stretch
attribution by sub-layer and the distance of the trajectory from its fixed point."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ._style import log_axis


def _require(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; the frame has {list(frame.columns)}")


def eigenvalue_plane(
    spectrum: pd.DataFrame, title: str = "eigenvalues of the token's Jacobian"
) -> go.Figure:
    """``fixed_point_spectrum``'s eigenvalues in the complex plane with the unit circle."""
    _require(spectrum, ("real", "imag", "modulus", "angle"), "eigenvalue_plane")
    theta = np.linspace(0, 2 * np.pi, 256)
    fig = go.Figure(
        go.Scatter(
            x=np.cos(theta),
            y=np.sin(theta),
            mode="lines",
            name="|λ| = 1",
            line=dict(color="grey", dash="dot"),
            hoverinfo="skip",
        )  # fmt: skip
    )
    outside = spectrum["modulus"] >= 1
    fig.add_trace(
        go.Scatter(
            x=spectrum["real"],
            y=spectrum["imag"],
            mode="markers",
            name="eigenvalues",
            marker=dict(size=10, color=np.where(outside, "crimson", "royalblue")),
            customdata=np.stack([spectrum["modulus"], spectrum["angle"]], axis=-1),
            hovertemplate="λ = %{x:.4f} %{y:+.4f}i<br>|λ| %{customdata[0]:.4f}, "
            "angle %{customdata[1]:.3f} rad<extra></extra>",
        )  # fmt: skip
    )
    reach = max(1.1, float(spectrum["modulus"].max()) * 1.1) if len(spectrum) else 1.1
    fig.update_layout(
        title=title, height=420, xaxis=dict(title="Re λ", range=[-reach, reach]),
        yaxis=dict(title="Im λ", range=[-reach, reach], scaleanchor="x", scaleratio=1),
    )  # fmt: skip
    return fig


def lyapunov_bars(spectrum: pd.DataFrame, title: str = "Lyapunov exponents") -> go.Figure:
    """``lyapunov_spectrum``'s exponents as bars (red: positive, blue: negative, grey: neutral, within
    its error of 0) with the zero line and, when the frame has ``stderr``, two-error bars."""
    _require(spectrum, ("index", "exponent"), "lyapunov_bars")
    colors = np.where(spectrum["exponent"] > 0, "crimson", "royalblue")
    if "neutral" in spectrum:
        colors = np.where(spectrum["neutral"].astype(bool), "grey", colors)
    errors = None
    if "stderr" in spectrum:
        errors = dict(type="data", array=2 * spectrum["stderr"].to_numpy(), visible=True)
    fig = go.Figure(go.Bar(x=spectrum["index"], y=spectrum["exponent"], marker_color=colors,
                           error_y=errors,
                           hovertemplate="λ_%{x} = %{y:.4f}<extra></extra>"))  # fmt: skip
    fig.add_hline(y=0, line_color="black", line_width=1)
    fig.update_layout(title=title, height=360, xaxis=dict(title="index", dtick=1),
                      yaxis_title="exponent (log per iteration)")  # fmt: skip
    return fig


def running_exponent(running: np.ndarray, warmup: int = 0, title: str = "running λ_1") -> go.Figure:
    """The running estimate of λ_1 after each step past the warm-up (flat = settled)."""
    running = np.asarray(running)
    values = running[:, 0] if running.ndim == 2 else running
    steps = np.arange(warmup + 1, warmup + 1 + len(values))
    fig = go.Figure(go.Scatter(x=steps, y=values, mode="lines+markers", name="λ_1"))
    fig.add_hline(y=0, line_color="black", line_width=1)
    fig.update_layout(title=title, height=340, xaxis_title="step", yaxis_title="λ_1 estimate")
    return fig


def attribution_bars(attribution: pd.DataFrame, title: str | None = None) -> go.Figure:
    """``stretch_attribution`` per sub-layer: the scale-free ``relative`` terms as bars with their
    running sum (primary), the absolute ``log_stretch`` as grey bars beside them when present."""
    _require(attribution, ("sublayer", "log_stretch", "cumulative"), "attribution_bars")
    if "relative" not in attribution:  # an older frame: the absolute view only
        attribution = attribution.assign(relative=attribution["log_stretch"],
                                         relative_cumulative=attribution["cumulative"])  # fmt: skip
    colors = np.where(attribution["relative"] > 0, "crimson", "royalblue")
    x = attribution["sublayer"]
    fig = go.Figure(go.Bar(x=x, y=attribution["relative"], marker_color=colors,
                           name="relative: log((‖δy‖/‖y‖)/(‖δx‖/‖x‖))",
                           hovertemplate="%{x}: %{y:.4f}<extra>relative</extra>"))  # fmt: skip
    fig.add_trace(go.Bar(x=x, y=attribution["log_stretch"], marker_color="lightgrey",
                         name="absolute: log(‖δy‖/‖δx‖), scale-dependent",
                         hovertemplate="%{x}: %{y:.4f}<extra>absolute</extra>"))  # fmt: skip
    fig.add_trace(go.Scatter(x=x, y=attribution["relative_cumulative"], mode="lines+markers",
                             name="relative, cumulative", line=dict(color="black")))  # fmt: skip
    total = float(attribution["relative"].sum())
    fig.update_layout(
        title=title or f"stretch of the leading direction per sub-layer (relative total {total:.4f})",
        height=380, barmode="group", xaxis=dict(title="sub-layer", type="category"),
        yaxis_title="log-stretch per sub-layer",
    )  # fmt: skip
    return fig


def fixed_point_distance(
    distances: np.ndarray, title: str = "distance from the fixed point"
) -> go.Figure:
    """‖s_i − s*‖ / ‖s*‖ over the steps i of a trajectory (log scale)."""
    distances = np.maximum(np.asarray(distances, dtype=float), 1e-12)
    fig = go.Figure(go.Scatter(x=np.arange(len(distances)), y=distances,
                               mode="lines+markers", name="‖s_i − s*‖ / ‖s*‖"))  # fmt: skip
    fig.update_layout(
        title=title,
        height=340,
        xaxis_title="step i",
        yaxis=log_axis(distances, "relative distance"),
    )
    return fig


def stability_series_figure(series: pd.DataFrame) -> go.Figure:
    """λ_1 (mean and max over tokens) and the share of stable tokens per checkpoint step."""
    _require(
        series, ("step", "lambda_1_mean", "lambda_1_max", "share_stable"), "stability_series_figure"
    )
    per_step = series.drop_duplicates("step").sort_values("step")
    fig = go.Figure()
    for column, name in (("lambda_1_mean", "mean λ_1"), ("lambda_1_max", "max λ_1")):
        fig.add_trace(
            go.Scatter(x=per_step["step"], y=per_step[column], mode="lines+markers", name=name)
        )
    fig.add_trace(go.Scatter(x=per_step["step"], y=per_step["share_stable"], mode="lines+markers",
                             name="share stable", yaxis="y2"))  # fmt: skip
    fig.add_hline(y=0, line_color="black", line_width=1)
    fig.update_layout(title="λ_1 across training", height=380, xaxis_title="training step",
                      yaxis_title="λ_1 (log per iteration)",
                      yaxis2=dict(title="share stable", overlaying="y", side="right", range=[0, 1.05]))  # fmt: skip
    return fig
