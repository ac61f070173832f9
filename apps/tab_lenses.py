"""The Lenses tab: what the coda lens or the logit lens reads from every intermediate state."""

from __future__ import annotations

import streamlit as st

from workbench import figures

from . import compute
from .ui import Context, chart, table_download


def render(ctx: Context) -> None:
    """What the coda lens or the logit lens reads from every state, per token and step."""
    kind = st.radio("Lens", ["coda", "logit"], horizontal=True, key="lens_kind")
    frame = compute.lens(ctx.model, ctx.traj, ctx.key, ctx.tokens, kind)
    value = st.selectbox(
        "Colour", ["final_prob", "kl_to_final", "entropy", "final_rank"], key="lens_value"
    )
    chart(figures.lens_heatmap(frame, value), "lens_heatmap")
    position = ctx.token_picker("Token", "lens_token", ctx.traj.n_tokens - 1)
    chart(figures.lens_table(frame, position), "lens_table")
    table_download(frame, f"lens_{kind}")
