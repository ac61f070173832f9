"""The Dynamics tab: each token's kind of motion over depth and one token's rotation plane."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench import figures
from workbench.dynamics import MIN_TAIL, DynamicsThresholds, dynamics_labels

from . import compute
from .inputs import MAX_STEPS
from .ui import Context, chart, default_tokens, quoted_tokens, table_download

SHOWN_KINDS = ("fixed_point", "converging", "orbit", "slider", "other")
KIND_MEANINGS = (
    "**fixed point**: has stopped moving · **converging**: heading for a fixed point, still "
    "moving · **orbit**: circles a closed loop (period in steps) · **slider**: drifts steadily "
    "one way · **other**: none of these over the steps run."
)
UNSETTLED_SHARE = 0.25  # suggest more steps when at least this share is converging or other
# the classifier's columns the table shows, under the words it shows them by
TABLE_COLUMNS = {
    "token_text": "token",
    "kind": "kind",
    "settled": "settled",
    "period": "period (steps)",
    "angular_speed": "angular speed (rad/step)",
    "drift_speed": "drift per step",
    "final_step_size": figures.words("final_step_size"),
}


def settled(frame: pd.DataFrame) -> pd.Series:
    """Whether each token has stopped moving: `classify_dynamics`' ``settled`` column, or (from a
    workbench without it) its last relative step below the classifier's fixed-point tolerance."""
    if "settled" in frame.columns:
        return frame["settled"].astype(bool)
    return frame["final_step_size"] < DynamicsThresholds().fixed_tol


def shown_kinds(frame: pd.DataFrame) -> pd.Series:
    """The kind each token is shown as: ``workbench.dynamics.dynamics_labels``, the labels the
    Training tab's shares and the notebooks count too ("converging": a fixed point not settled)."""
    return dynamics_labels(frame)


def more_steps_hint(kinds: pd.Series, num_steps: int) -> None:
    """Suggest more steps (with a button) when many tokens are still on their way."""
    moving = int(kinds.isin(["converging", "other"]).sum())
    if moving < UNSETTLED_SHARE * len(kinds) or num_steps >= MAX_STEPS:
        return
    more = min(2 * num_steps, MAX_STEPS)
    st.info(
        f"{moving} of {len(kinds)} tokens have not settled in {num_steps} steps (converging or "
        f"other): more steps may show where they end up."
    )
    st.button(
        f"Use {more} steps",
        key="dyn_more_steps",
        on_click=lambda: st.session_state.update(steps=more),
    )


def dynamics_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The table the tab shows: each token's position first (two equal tokens stay apart), the
    token in quotes with escapes, the kind in words and the columns under `TABLE_COLUMNS`."""
    shown = quoted_tokens(frame[list(TABLE_COLUMNS)], "token_text")
    shown["kind"] = shown["kind"].str.replace("_", " ")
    shown.insert(0, "position", frame.index.to_numpy())
    return shown.rename(columns=TABLE_COLUMNS)


def _select_row() -> None:
    """Clicking a row of the dynamics table selects that token for the rotation panels."""
    rows = st.session_state["dyn_table"].selection.rows
    if rows:
        st.session_state["dyn_token"] = int(rows[0])


def render(ctx: Context) -> None:
    """Per-token kind (fixed point, converging, orbit, slider, other) and one token's rotation."""
    if ctx.traj.num_steps < MIN_TAIL:
        st.info(f"The dynamics classifier needs at least {MIN_TAIL} steps; raise the step count.")
        return
    frame = compute.dynamics(ctx.traj, ctx.tokens).copy()
    frame["kind"], frame["settled"] = shown_kinds(frame), settled(frame)
    counts = frame["kind"].value_counts()
    for col, kind in zip(st.columns(len(SHOWN_KINDS)), SHOWN_KINDS):
        col.metric(kind.replace("_", " "), int(counts.get(kind, 0)))
    st.caption(
        f"{KIND_MEANINGS} Classified at {ctx.traj.num_steps} steps from {ctx.start}; the Training "
        "tab counts the same labels."
    )
    more_steps_hint(frame["kind"], ctx.traj.num_steps)
    st.dataframe(
        dynamics_table(frame),
        hide_index=True,
        column_config={"token": st.column_config.TextColumn("token", width="medium")},
        key="dyn_table",
        on_select=_select_row,
        selection_mode="single-row",
    )
    orbits = frame.index[frame["kind"] == "orbit"].tolist()
    position = ctx.token_picker(
        "Token to inspect (or click a row)",
        "dyn_token",
        orbits[0] if orbits else default_tokens(ctx.tokens, 1)[0],
    )  # an orbit when there is one, else a digit (the paper's orbiting " 3") or the last token
    row = frame.loc[position]
    st.caption(
        f"{ctx.labels[position]}: {row['kind'].replace('_', ' ')}"
        + (f", period {row['period']:.1f} steps" if row["kind"] == "orbit" else "")
    )
    basis = compute.plane(ctx.traj, position)
    run = f"seed {ctx.traj.seeds[0]}"
    chart(
        figures.rotation_panel(
            ctx.traj.states[0][:, position], basis, ctx.labels[position], run=run
        ),
        "rotation",
    )
    coords, evr = compute.pca(ctx.traj)
    chart(
        figures.pc_pair_panels(coords, [position], ctx.tokens, explained_variance=evr, run=run),
        "dyn_pc_pairs",
    )
    table_download(frame.reset_index(), "dynamics")
