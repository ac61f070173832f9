"""The Trajectories tab: every token's path on the PC pairs, the 3-D waterfall and UMAP on request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import streamlit as st

from workbench import figures

from . import compute, cost
from .ui import PC_PAIRS, Context, chart, default_tokens, download, table_download


def coords_frame(coords: np.ndarray, tokens: Sequence[str]) -> pd.DataFrame:
    """PCA coordinates (steps + 1, T, k) as a long table: step, position, token, pc1 … pck."""
    steps, T, k = coords.shape
    step, pos = np.meshgrid(np.arange(steps), np.arange(T), indexing="ij")
    frame = pd.DataFrame({"step": step.ravel(), "position": pos.ravel()})
    frame["token"] = np.asarray(tokens, dtype=object)[frame["position"]]
    for c in range(k):
        frame[f"pc{c + 1}"] = coords[..., c].ravel()
    return frame


def render(ctx: Context) -> None:
    """PCA per PC pair per token, the 3-D waterfall, and UMAP on request."""
    coords, evr = compute.pca(ctx.traj)
    seeds = ctx.traj.seeds
    run = f"seed {seeds[0]}"
    st.caption(
        f"The paths start from {ctx.start}."
        + (" The other seeds are compared in Path independence." if len(seeds) > 1 else "")
        + " The PCA is fitted on all its states."
    )
    positions = ctx.tokens_picker("Tokens", "traj_tokens", default_tokens(ctx.tokens))
    if positions:
        chart(
            figures.pc_pair_panels(coords, positions, ctx.tokens, explained_variance=evr, run=run),
            "pc_pairs",
        )
    else:
        st.info("Pick at least one token to see its path on the PC pairs.")
    pair = st.selectbox("Waterfall plane", list(PC_PAIRS), key="waterfall_pair")
    if max(PC_PAIRS[pair]) < coords.shape[-1]:
        chart(
            figures.waterfall_3d(coords, ctx.tokens, components=PC_PAIRS[pair], run=run),
            "waterfall",
        )
    states = (ctx.traj.num_steps + 1) * ctx.traj.n_tokens
    guess = cost.umap_estimate(states)
    umap_label = (
        f"UMAP of the {states} states of {run} (fitted on their first 50 principal components, "
        f"so its time depends on the states, not the model's size): {guess.describe()}"
    )
    if st.toggle(umap_label, key="umap"):
        progress = compute.TaskProgress(f"Fitting UMAP on {states} states", "s", guess)
        coords_umap = compute.umap(ctx.traj, _progress=progress)
        fig = figures.waterfall_3d(coords_umap, ctx.tokens, run=run)
        fig.update_layout(
            title=f"UMAP of all states by token position ({run})",
            scene=dict(yaxis_title="UMAP1", zaxis_title="UMAP2"),
        )
        chart(fig, "umap_waterfall")
    traj = ctx.traj  # the lazy download holds the trajectory, not the model
    download(
        "Download trajectory (.safetensors)",
        lambda: compute.trajectory_file(traj),
        "trajectory.safetensors",
        "dl_trajectory",
    )
    table_download(coords_frame(coords, ctx.traj.tokens), "pca_coordinates")
