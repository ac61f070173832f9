"""The Dynamics tab: each token's kind of motion over depth and one token's rotation plane."""

from __future__ import annotations

import streamlit as st

from workbench import figures
from workbench.dynamics import KINDS, MIN_TAIL

from . import compute
from .ui import Context, chart, table_download


def _select_row() -> None:
    """Clicking a row of the dynamics table selects that token for the rotation panels."""
    rows = st.session_state["dyn_table"].selection.rows
    if rows:
        st.session_state["dyn_token"] = int(rows[0])


def render(ctx: Context) -> None:
    """Per-token kind (fixed point, orbit, slider, other) and a rotation panel for one token."""
    if ctx.traj.num_steps < MIN_TAIL:
        st.info(f"The dynamics classifier needs at least {MIN_TAIL} steps; raise the step count.")
        return
    frame = compute.dynamics(ctx.traj, ctx.key, ctx.tokens)
    counts = frame["kind"].value_counts()
    for col, kind in zip(st.columns(len(KINDS)), KINDS):
        col.metric(kind.replace("_", " "), int(counts.get(kind, 0)))
    shown = ["token_text", "kind", "period", "angular_speed", "drift_speed", "final_step_size"]
    st.dataframe(frame[shown], key="dyn_table", on_select=_select_row, selection_mode="single-row")
    orbits = frame.index[frame["kind"] == "orbit"].tolist()
    position = ctx.token_picker(
        "Token to inspect (or click a row)", "dyn_token", orbits[0] if orbits else 0
    )
    row = frame.loc[position]
    st.caption(
        f"{ctx.labels[position]}: {row['kind']}"
        + (f", period {row['period']:.1f} steps" if row["kind"] == "orbit" else "")
    )
    basis = compute.plane(ctx.traj, ctx.key, position)
    chart(
        figures.rotation_panel(ctx.traj.states[0][:, position], basis, ctx.labels[position]),
        "rotation",
    )
    coords, evr = compute.pca(ctx.traj, ctx.key)
    chart(
        figures.pc_pair_panels(coords, [position], ctx.tokens, explained_variance=evr),
        "dyn_pc_pairs",
    )
    table_download(frame.reset_index(), "dynamics")
