"""The Path independence tab: do runs from different random s_0 reach the same states?"""

from __future__ import annotations

import streamlit as st

from workbench import figures

from . import compute, cost
from .ui import PC_PAIRS, Context, chart, default_tokens, quoted_tokens, table_download


def render(ctx: Context) -> None:
    """Spread between seeds per step, one token's seed overlay, and the attractor distance."""
    if ctx.traj.n_runs < 2:
        st.info("Path independence compares seeds: enter at least two (e.g. 0, 1, 2, 3, 4).")
        return
    spread = compute.path_independence(ctx.traj, ctx.tokens)
    chart(figures.spread_curves(spread), "spread")
    position = ctx.token_picker("Token", "pi_token", default_tokens(ctx.tokens, 1)[0])
    pair = st.selectbox("Plane", list(PC_PAIRS), key="pi_pair")
    coords, _ = compute.pca(ctx.traj, all_seeds=True)
    if max(PC_PAIRS[pair]) < coords.shape[-1]:
        fig = figures.seed_overlay(coords, position, PC_PAIRS[pair], ctx.traj.seeds, ctx.tokens)
        chart(fig, "seed_overlay")
    guess = cost.umap_estimate(ctx.traj.n_runs * (ctx.traj.num_steps + 1), "aligned")
    if st.toggle(f"Aligned UMAP of this token across seeds: {guess.describe()}", key="pi_aligned"):
        progress = compute.TaskProgress("Fitting AlignedUMAP", "s", guess)
        embeddings = compute.aligned_umap(ctx.traj, position, _progress=progress)
        names = [f"seed {s}" for s in ctx.traj.seeds]
        fig = figures.aligned_embeddings_figure(embeddings, names, f"token {ctx.labels[position]}")
        chart(fig, "aligned_umap")
    attractor = compute.attractor_distance(ctx.traj, ctx.tokens)
    shown = quoted_tokens(attractor).rename(columns=figures.words)
    st.dataframe(shown, hide_index=True, key="pi_attractor")
    table_download(spread, "path_independence")
    table_download(attractor, "attractor_distance")
