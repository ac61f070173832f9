"""The Bundle tab: the app's current analysis written as one zip (``workbench.bundle.export``:
settings, frames as Parquet, figures as HTML, JSON and PNG, a README), and a bundle opened from an
upload and shown as it was written, without any model.

The analysis is the sidebar's run (its tokens, convergence, steps to converge, step dynamics,
dynamics kinds and PCA) and, when the Compare tab has drawn one for this run, the comparison with
a second model.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st
import streamlit.components.v1 as components

import workbench.bundle
from workbench import figures
from workbench.bundle import Analysis, Bundle, BundleError, analysis_settings
from workbench.dynamics import MIN_TAIL

from . import compute
from .tab_compare import LAST_COMPARISON
from .tab_dynamics import shown_kinds
from .ui import Context, chart, default_tokens, download

BUNDLE_FILE = "bundle_file"  # session state: (file name, zip bytes, the run's key) last written
WRITE = "Write the bundle"
STEPS_EPS = 1e-2  # ε of the steps-to-converge frame (the Convergence tab's default)
PCA_COMPONENTS = 6


def render(ctx: Context) -> None:
    """Write the current analysis as a bundle (then download it), or open an uploaded one."""
    st.subheader("Download this analysis")
    st.caption(
        "One zip: the settings (model, config hash, prompt, steps, seeds, package versions), every "
        "table as Parquet, every figure as HTML, JSON and PNG, and a README saying what it holds. "
        "Open it here again or with `workbench.bundle.open`. The PNGs are drawn by kaleido (a few "
        "seconds)."
    )
    if st.button(WRITE, key="bundle_write"):
        with st.spinner("Writing the bundle …", show_time=True):
            analysis = current_analysis(ctx)
            st.session_state[BUNDLE_FILE] = (file_name(ctx), export_bytes(analysis), ctx.key)
    held = st.session_state.get(BUNDLE_FILE)
    if held is not None and held[2] == ctx.key:
        name, data, _ = held
        download(f"Download bundle ({len(data) / 2**20:.1f} MiB)", data, name, "bundle_download")
    st.subheader("Open a bundle")
    upload = st.file_uploader("A bundle (.zip)", type=["zip"], key="bundle_upload")
    if upload is None:
        return
    try:
        bundle = open_upload(upload.name, upload.getvalue())
    except BundleError as exc:
        st.error(str(exc))
        return
    show_bundle(bundle, upload.name)


def file_name(ctx: Context) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in str(ctx.model.name))
    return f"{safe}-{ctx.traj.num_steps}-steps-bundle.zip"


def current_analysis(ctx: Context) -> Analysis:
    """The sidebar's run as the tabs show it (and the Compare tab's comparison of it, if any)."""
    run, prompt = ctx.run, ctx.prompt
    settings = analysis_settings(
        ctx.model, prompt=None if prompt is None else prompt.prompt, num_steps=run.num_steps,
        seeds=run.seeds, init_scale=run.init_scale,
        family=getattr(ctx.model, "family", "Huginn"),
        checkpoint=st.session_state.get("checkpoint"), device=str(ctx.model.device),
        dtype=str(ctx.model.dtype).removeprefix("torch."),
        chat=None if prompt is None else prompt.chat,
        system=None if prompt is None else prompt.system, token_ids=list(run.token_ids),
    )  # fmt: skip
    frames, built = analysis_frames(ctx)
    comparison = st.session_state.get(LAST_COMPARISON)
    if comparison is not None and comparison.first_key == ctx.key:
        settings |= comparison.settings
        frames |= comparison.frames
        built |= comparison.figures
    return Analysis(settings, frames, built)


def analysis_frames(ctx: Context) -> tuple[dict[str, pd.DataFrame], dict]:
    """The run's frames and the figures drawn from them (the cached ones the tabs use)."""
    traj, tokens = ctx.traj, ctx.tokens
    conv = compute.convergence(traj, tokens)
    dyn = compute.step_dynamics(traj, tokens)
    frames = {
        "tokens": pd.DataFrame({"position": np.arange(traj.n_tokens),
                                "token_id": np.asarray(traj.token_ids, dtype=np.int64),
                                "token": pd.Series(tokens, dtype=object)}),
        "convergence": conv,
        "steps_to_converge": compute.steps_to_converge(traj, tokens, STEPS_EPS),
        "step_dynamics": dyn,
    }  # fmt: skip
    coords, ratios = compute.pca(traj, n_components=PCA_COMPONENTS)
    frames["pca"] = pca_frame(coords)
    frames["pca_variance"] = pd.DataFrame(
        {"component": [f"pc{c + 1}" for c in range(len(ratios))], "explained": ratios}
    )
    picked = default_tokens(tokens, 1)
    built = {
        "convergence": figures.convergence_heatmap(conv),
        "step_curves": figures.step_curves(dyn, "acceleration", log=True),
        "pc_pairs": figures.pc_pair_panels(coords, picked, tokens, explained_variance=ratios),
    }
    if traj.num_steps >= MIN_TAIL:
        kinds = compute.dynamics(traj, tokens).copy()
        kinds["kind"] = shown_kinds(kinds)
        # the classifier's token column holds the position as text; token_text is the token
        kinds = kinds.drop(columns="token").rename(columns={"token_text": "token"})
        frames["dynamics"] = kinds.reset_index()
    return frames, built


def pca_frame(coords: np.ndarray) -> pd.DataFrame:
    """Seed 0's PCA coordinates (steps + 1, T, k) as a long frame: step, position, pc1 … pck."""
    steps, positions = np.meshgrid(
        np.arange(coords.shape[0]), np.arange(coords.shape[1]), indexing="ij"
    )
    frame = pd.DataFrame({"step": steps.ravel(), "position": positions.ravel()})
    for c in range(coords.shape[-1]):
        frame[f"pc{c + 1}"] = coords[..., c].ravel()
    return frame


def export_bytes(analysis: Analysis) -> bytes:
    """The analysis as a bundle's bytes, written in a temporary directory and read back."""
    with tempfile.TemporaryDirectory() as tmp:
        return workbench.bundle.export(analysis, Path(tmp) / "bundle.zip").read_bytes()


def open_upload(name: str, data: bytes) -> Bundle:
    """An uploaded bundle opened from a temporary file (never extracted); a BundleError names the
    upload, not the temporary path."""
    shown = Path(name).name or "bundle.zip"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / shown
        path.write_bytes(data)
        try:
            return workbench.bundle.open(path)
        except BundleError as exc:
            raise BundleError(str(exc).replace(str(path), shown)) from None


def show_bundle(bundle: Bundle, name: str) -> None:
    """The bundle as it was written: its settings, every frame and every figure."""
    index, settings = bundle.index, bundle.settings
    st.success(
        f"`{name}`: {index.get('kind')} bundle written {index.get('created')}"
        + (f", model **{settings['model']}**" if settings.get("model") else "")
        + f"; {len(bundle.frames)} tables, {len(bundle.figures)} figures. No model is run."
    )
    rows = [{"setting": k, "value": v if isinstance(v, str) else json.dumps(v)}
            for k, v in settings.items()]  # fmt: skip
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="bundle_settings")
    for fig_name in bundle.figures:
        fig = bundle.figure(fig_name)
        if fig is not None:
            chart(fig, f"bundle_figure_{fig_name}")
        elif (png := bundle.figure_png(fig_name)) is not None:
            st.image(png, caption=fig_name)
        else:
            components.html(bundle.figure_html(fig_name), height=600, scrolling=True)
    for frame_name, frame in bundle.frames.items():
        st.markdown(f"**{frame_name}** ({len(frame):,} rows)")
        st.dataframe(frame, hide_index=True, key=f"bundle_frame_{frame_name}")
