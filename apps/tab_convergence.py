"""The Convergence tab: distance to the final state per token and step, and how fast steps shrink."""

from __future__ import annotations

import streamlit as st

from workbench import figures

from . import compute
from .ui import Context, chart, quoted_tokens, table_download


def render(ctx: Context) -> None:
    """The convergence heatmap, steps to converge, step dynamics and token correlation."""
    frame = compute.convergence(ctx.traj, ctx.tokens)
    value = st.selectbox(
        "Colour",
        ["distance_to_final", "relative_step"],
        format_func=figures.words,
        key="conv_value",
    )
    chart(figures.convergence_heatmap(frame, value), "conv_heatmap")
    eps = st.number_input("ε for steps to converge", value=1e-2, format="%.0e", key="conv_eps")
    settled = compute.steps_to_converge(ctx.traj, ctx.tokens, float(eps))
    shown = quoted_tokens(settled).rename(columns=figures.words)
    st.dataframe(shown, hide_index=True, key="conv_settled")
    dyn = compute.step_dynamics(ctx.traj, ctx.tokens)
    which = st.selectbox(
        "Step dynamics",
        ["acceleration", "delta_norm", "delta_cosine"],
        format_func=figures.words,
        key="conv_dynamics",
    )
    chart(figures.step_curves(dyn, which, log=which != "delta_cosine"), "step_curves")
    if ctx.traj.n_tokens >= 2:
        corr = compute.token_correlation(ctx.traj)
        chart(figures.token_correlation_curve(corr), "token_corr")
        table_download(corr, "token_correlation")
    table_download(frame, "convergence")
    table_download(settled, "steps_to_converge")
    table_download(dyn, "step_dynamics")
