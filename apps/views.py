"""The app's views (one function per tab). Figures come from ``workbench.figures``; analyses from
the cached workbench calls in ``apps.compute``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from recurrent_model.sampling import EXIT_CRITERIA as MODEL_EXIT_CRITERIA
from workbench import figures, position_labels
from workbench.dynamics import KINDS, MIN_TAIL

from . import compute
from .inputs import RunSettings
from .messages import shown_as_message
from .wavefront_view import wavefront_view

PC_PAIRS = {"PC1 / PC2": (0, 1), "PC3 / PC4": (2, 3), "PC5 / PC6": (4, 5)}
EXIT_CRITERIA = ("none (fixed steps)", *MODEL_EXIT_CRITERIA)


@dataclass
class Context:
    """What every view needs: the model, the collected trajectory and the keys that name them."""

    model: object
    model_key: str
    traj: object
    run: RunSettings

    @property
    def key(self) -> tuple:
        return (self.model_key, self.run)

    @property
    def labels(self) -> list[str]:
        return position_labels(self.traj.tokens, self.traj.n_tokens)

    def token_picker(self, label: str, key: str, default: int = 0) -> int:
        positions = list(range(self.traj.n_tokens))
        default = min(max(default, 0), len(positions) - 1)
        return st.selectbox(
            label, positions, index=default, format_func=lambda p: self.labels[p], key=key
        )


def chart(fig: go.Figure, key: str) -> None:
    st.plotly_chart(fig, key=key, width="stretch")


def download(label: str, data: Callable[[], bytes] | bytes, file_name: str, key: str) -> None:
    """A download button that does not rerun the script; ``data`` may be a lazy callable."""
    mime = "text/csv" if file_name.endswith(".csv") else "application/octet-stream"
    st.download_button(label, data, file_name=file_name, mime=mime, key=key, on_click="ignore")


def table_download(frame: pd.DataFrame, name: str) -> None:
    download(f"Download {name}.csv", lambda: compute.csv_bytes(frame), f"{name}.csv", f"dl_{name}")


def default_tokens(tokens: Sequence[str], n: int = 3) -> list[int]:
    """Initial token choice: those holding a digit (the paper's orbiting " 3"), else the last n."""
    digits = [i for i, t in enumerate(tokens) if any(c.isdigit() for c in t)]
    return digits[:n] if digits else list(range(max(0, len(tokens) - n), len(tokens)))


def coords_frame(coords: np.ndarray, tokens: Sequence[str]) -> pd.DataFrame:
    """PCA coordinates (steps + 1, T, k) as a long table: step, position, token, pc1 … pck."""
    steps, T, k = coords.shape
    step, pos = np.meshgrid(np.arange(steps), np.arange(T), indexing="ij")
    frame = pd.DataFrame({"step": step.ravel(), "position": pos.ravel()})
    frame["token"] = np.asarray(tokens, dtype=object)[frame["position"]]
    for c in range(k):
        frame[f"pc{c + 1}"] = coords[..., c].ravel()
    return frame


# Views ------------------------------------------------------------------------------------------
def trajectories_view(ctx: Context) -> None:
    """PCA per PC pair per token, the 3-D waterfall, and UMAP on request."""
    coords, evr = compute.pca(ctx.traj, ctx.key)
    positions = st.multiselect(
        "Tokens",
        list(range(ctx.traj.n_tokens)),
        default=default_tokens(ctx.traj.tokens),
        format_func=lambda p: ctx.labels[p],
        key="traj_tokens",
    )
    if positions:
        chart(
            figures.pc_pair_panels(coords, positions, ctx.traj.tokens, explained_variance=evr),
            "pc_pairs",
        )
    else:
        st.info("Pick at least one token to see its path on the PC pairs.")
    pair = st.selectbox("Waterfall plane", list(PC_PAIRS), key="waterfall_pair")
    if max(PC_PAIRS[pair]) < coords.shape[-1]:
        chart(figures.waterfall_3d(coords, ctx.traj.tokens, components=PC_PAIRS[pair]), "waterfall")
    if st.toggle("UMAP (slow the first time: the umap import takes ~20 s)", key="umap"):
        fig = figures.waterfall_3d(compute.umap(ctx.traj, ctx.key), ctx.traj.tokens)
        fig.update_layout(
            title="UMAP of all states by token position",
            scene=dict(yaxis_title="UMAP1", zaxis_title="UMAP2"),
        )
        chart(fig, "umap_waterfall")
    download(
        "Download trajectory (.safetensors)",
        lambda: compute.trajectory_file(ctx.traj, ctx.key),
        "trajectory.safetensors",
        "dl_trajectory",
    )
    table_download(coords_frame(coords, ctx.traj.tokens), "pca_coordinates")


def convergence_view(ctx: Context) -> None:
    """The convergence heatmap, steps to converge, step dynamics and token correlation."""
    frame = compute.convergence(ctx.traj, ctx.key)
    value = st.selectbox("Colour", ["distance_to_final", "relative_step"], key="conv_value")
    chart(figures.convergence_heatmap(frame, value), "conv_heatmap")
    eps = st.number_input("ε for steps to converge", value=1e-2, format="%.0e", key="conv_eps")
    settled = compute.steps_to_converge(ctx.traj, ctx.key, float(eps))
    st.dataframe(settled, hide_index=True, key="conv_settled")
    dyn = compute.step_dynamics(ctx.traj, ctx.key)
    which = st.selectbox(
        "Step dynamics", ["acceleration", "delta_norm", "delta_cosine"], key="conv_dynamics"
    )
    chart(figures.step_curves(dyn, which, log=which != "delta_cosine"), "step_curves")
    if ctx.traj.n_tokens >= 2:
        corr = compute.token_correlation(ctx.traj, ctx.key)
        chart(figures.token_correlation_curve(corr), "token_corr")
        table_download(corr, "token_correlation")
    table_download(frame, "convergence")
    table_download(settled, "steps_to_converge")
    table_download(dyn, "step_dynamics")


def path_independence_view(ctx: Context) -> None:
    """Spread between seeds per step, one token's seed overlay, and the attractor distance."""
    if ctx.traj.n_runs < 2:
        st.info("Path independence compares seeds: enter at least two (e.g. 0, 1, 2, 3, 4).")
        return
    spread = compute.path_independence(ctx.traj, ctx.key)
    chart(figures.spread_curves(spread), "spread")
    position = ctx.token_picker("Token", "pi_token", default_tokens(ctx.traj.tokens, 1)[0])
    pair = st.selectbox("Plane", list(PC_PAIRS), key="pi_pair")
    coords, _ = compute.pca(ctx.traj, ctx.key, all_seeds=True)
    if max(PC_PAIRS[pair]) < coords.shape[-1]:
        fig = figures.seed_overlay(
            coords, position, PC_PAIRS[pair], ctx.traj.seeds, ctx.traj.tokens
        )
        chart(fig, "seed_overlay")
    if st.toggle(
        "Aligned UMAP of this token across seeds (slow: numba compiles the first time)",
        key="pi_aligned",
    ):
        embeddings = compute.aligned_umap(ctx.traj, ctx.key, position)
        names = [f"seed {s}" for s in ctx.traj.seeds]
        fig = figures.aligned_embeddings_figure(embeddings, names, f"token {ctx.labels[position]}")
        chart(fig, "aligned_umap")
    attractor = compute.attractor_distance(ctx.traj, ctx.key)
    st.dataframe(attractor, hide_index=True, key="pi_attractor")
    table_download(spread, "path_independence")
    table_download(attractor, "attractor_distance")


def _select_row() -> None:
    """Clicking a row of the dynamics table selects that token for the rotation panels."""
    rows = st.session_state["dyn_table"].selection.rows
    if rows:
        st.session_state["dyn_token"] = int(rows[0])


def dynamics_view(ctx: Context) -> None:
    """Per-token kind (fixed point, orbit, slider, other) and a rotation panel for one token."""
    if ctx.traj.num_steps < MIN_TAIL:
        st.info(f"The dynamics classifier needs at least {MIN_TAIL} steps; raise the step count.")
        return
    frame = compute.dynamics(ctx.traj, ctx.key)
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
        figures.pc_pair_panels(coords, [position], ctx.traj.tokens, explained_variance=evr),
        "dyn_pc_pairs",
    )
    table_download(frame.reset_index(), "dynamics")


def lenses_view(ctx: Context) -> None:
    """What the coda lens or the logit lens reads from every state, per token and step."""
    kind = st.radio("Lens", ["coda", "logit"], horizontal=True, key="lens_kind")
    frame = compute.lens(ctx.model, ctx.traj, ctx.key, kind)
    value = st.selectbox(
        "Colour", ["final_prob", "kl_to_final", "entropy", "final_rank"], key="lens_value"
    )
    chart(figures.lens_heatmap(frame, value), "lens_heatmap")
    position = ctx.token_picker("Token", "lens_token", ctx.traj.n_tokens - 1)
    chart(figures.lens_table(frame, position), "lens_table")
    table_download(frame, f"lens_{kind}")


def generation_view(ctx: Context) -> None:
    """Generate a continuation with an adaptive exit and show the iterations spent per token."""
    room = ctx.model.config.block_size - len(ctx.run.token_ids)
    with st.form("generation"):
        new = st.number_input("New tokens", value=min(24, max(room, 1)), step=1, key="gen_new")
        crit = st.selectbox("Exit criterion", EXIT_CRITERIA, index=1, key="gen_exit")
        thr = st.number_input(
            "Exit threshold (0 = the criterion's default)",
            value=0.0,
            format="%.1e",
            key="gen_threshold",
        )
        if st.form_submit_button("Generate"):
            st.session_state["gen_request"] = (int(new), crit, float(thr))
    request = st.session_state.get("gen_request")
    if request is None:
        st.info(f"Press Generate: up to {ctx.run.num_steps} steps per token (the sidebar's steps).")
        return
    new, crit, thr = request
    if not 1 <= new <= room:
        st.error(f"New tokens must lie between 1 and {room} (the context left after the prompt).")
        return
    criterion = None if crit == EXIT_CRITERIA[0] else crit
    threshold = thr if criterion is not None and thr > 0 else None
    with shown_as_message():
        out = compute.generation(
            ctx.model,
            ctx.model_key,
            ctx.run.token_ids,
            new,
            ctx.run.num_steps,
            criterion,
            threshold,
            ctx.run.init_scale,
        )
        st.code(out["text"] or "(stopped at once)", language=None, wrap_lines=True)
        st.metric("Mean steps per token", f"{out['mean_steps']:.1f}")
        table = out["table"]
        if len(table):
            chart(
                figures.steps_per_token_bars(
                    table["steps"], table["token"], max_steps=ctx.run.num_steps
                ),
                "gen_steps",
            )
        st.dataframe(table, hide_index=True, key="gen_table")
        table_download(table, "generation_steps")


def interventions_view(ctx: Context) -> None:
    """Patching, steering and ablation over depth (apps/intervention_views.py)."""
    from .intervention_views import interventions_view as view

    view(ctx)


def training_view(ctx: Context) -> None:
    """Dynamics across training (apps/training_view.py)."""
    from .training_view import training_view as view

    view(ctx)


VIEWS: dict[str, Callable[[Context], None]] = {
    "Trajectories": trajectories_view,
    "Convergence": convergence_view,
    "Path independence": path_independence_view,
    "Dynamics": dynamics_view,
    "Lenses": lenses_view,
    "Generation": generation_view,
    "Wavefront": wavefront_view,
    "Interventions": interventions_view,
    "Training": training_view,
}
