"""Per token: where the learned exit sends it against where its state converges
(``workbench.exits.exit_and_convergence``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

#: Marker colour per dynamics label.
LABEL_COLOURS = {"fixed_point": "#2a9d8f", "converging": "#e9c46a", "orbit": "#e76f51",
                 "slider": "#6d597a", "other": "#8d99ae"}  # fmt: skip


def exit_convergence_figure(frame: pd.DataFrame, title: str = "") -> go.Figure:
    """Tokens along x; the step each one's state converges at (circles, coloured by its dynamics
    label; an open circle at the last step when it never did) and, with a learned exit, the loop
    the exit rule picks (crosses) and the exit distribution's mean loop (dashes)."""
    steps = int(frame.attrs.get("num_steps", 0))
    x = [f"{p}: {t!r}" for p, t in zip(frame["position"], frame["token"])]
    converged = frame["steps_to_converge"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    never = np.isnan(converged)
    fig = go.Figure()
    for label, colour in LABEL_COLOURS.items():
        rows = (frame["label"] == label).to_numpy()
        if rows.any():
            y = np.where(never, steps, converged)[rows]
            fig.add_trace(go.Scatter(
                x=np.asarray(x)[rows], y=y, mode="markers", name=label.replace("_", " "),
                marker=dict(color=colour, size=10,
                            symbol=np.where(never[rows], "circle-open", "circle")),
            ))  # fmt: skip
    if frame.attrs.get("learned_exit"):
        threshold = frame.attrs.get("threshold")
        fig.add_trace(go.Scatter(x=x, y=frame["exit_step"], mode="markers",
                                 name=f"exit rule (cumulative p ≥ {threshold})",
                                 marker=dict(symbol="x", size=9, color="black")))  # fmt: skip
        fig.add_trace(go.Scatter(x=x, y=frame["expected_exit"], mode="markers",
                                 name="mean exit loop",
                                 marker=dict(symbol="line-ew-open", size=14, color="black")))  # fmt: skip
    else:
        fig.add_annotation(text="no learned exit in this family", xref="paper", yref="paper",
                           x=1, y=1.08, showarrow=False)  # fmt: skip
    fig.update_layout(title=title or f"exit against convergence · {frame.attrs.get('model', '')}",
                      xaxis_title="token", yaxis_title="loop / step", yaxis_range=[0, steps + 1],
                      xaxis=dict(categoryorder="array", categoryarray=x), height=420,
                      legend_title_text="circle: step converged (open: not in the run)")  # fmt: skip
    return fig
