"""The Lenses tab: what the coda lens or the logit lens reads from every intermediate state."""

from __future__ import annotations

import streamlit as st

from workbench import figures

from . import compute, cost
from .ui import Context, chart, estimate_gate, table_download


def lens_estimate(ctx: Context, kind: str) -> cost.CostEstimate:
    """The estimated time of decoding every state s_0 … s_r of seed 0 through the lens."""
    config, tokens, steps = ctx.model.config, ctx.traj.n_tokens, ctx.traj.num_steps
    flops = cost.lens_flops(config, tokens, steps, kind)
    calls = cost.lens_calls(config, steps, kind)
    table = cost.LENS_ROW_S * tokens * (steps + 1)
    return compute.estimate_flops(
        ctx.model, flops, rows=tokens, calls=calls, action=f"lens {kind}", extra_seconds=table
    )


def render(ctx: Context) -> None:
    """What the coda lens or the logit lens reads from every state, per token and step."""
    kind = st.radio("Lens", ["coda", "logit"], horizontal=True, key="lens_kind")
    guess = lens_estimate(ctx, kind)
    states = (ctx.traj.num_steps + 1) * ctx.traj.n_tokens
    what = f"{states} states through the {kind} lens"
    if not estimate_gate(f"Decoding {what}", guess, "lens_go", (ctx.key, kind)):
        return
    progress = compute.TaskProgress(f"Decoding {what}", "states", guess)
    frame = compute.lens(ctx.model, ctx.traj, ctx.tokens, kind, _progress=progress)
    value = st.selectbox(
        "Colour",
        ["final_prob", "kl_to_final", "entropy", "final_rank"],
        format_func=figures.words,
        key="lens_value",
    )
    chart(figures.lens_heatmap(frame, value), "lens_heatmap")
    position = ctx.token_picker("Token", "lens_token", ctx.traj.n_tokens - 1)
    chart(figures.lens_table(frame, position), "lens_table")
    table_download(frame, f"lens_{kind}")
