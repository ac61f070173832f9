"""The "Training" tab: dynamics across training, ``workbench.checkpoint_series`` on the current prompt.

Reads the ``step-N`` checkpoints of a run directory (by default the intermediate checkpoints kept with
the default model in ``checkpoints/default/series``) and shows loss per depth, dynamics shares,
path-independence spread and token correlation of the prompt at each training step.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

import workbench
from workbench import figures
from workbench.checkpoint_series import checkpoint_dirs

from .inputs import InputError, resolve_checkpoint

DEFAULT_SERIES = "checkpoints/default/series"


def series_signature(run_dir: Path) -> str:
    """Step numbers and config mtimes of the run's checkpoints: changes when a checkpoint is added."""
    return ";".join(
        f"{s}:{(p / 'config.json').stat().st_mtime_ns}" for s, p in checkpoint_dirs(run_dir)
    )


@st.cache_data(max_entries=4, show_spinner=False)
def checkpoint_series(
    run_dir: str, text: str, num_steps: int, seeds: tuple[int, ...], signature: str
) -> pd.DataFrame:
    del signature  # part of the cache key only
    bar = st.progress(0.0, text="Analysing the checkpoints …")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Analysed {done} of {total} checkpoints")

    frame = workbench.checkpoint_series(
        run_dir, [text], num_steps=num_steps, seeds=seeds, progress=progress
    )
    bar.empty()
    return frame


def training_view(ctx) -> None:
    """Loss per depth and dynamics of the current prompt across a run's saved checkpoints."""
    st.caption(
        "Every saved checkpoint of a training run, in step order, run on the current prompt: "
        "loss at each depth, the share of fixed points / orbits / sliders, the spread between seeds "
        "and the token correlation at the chosen number of steps."
    )
    text = st.text_input(
        "Run directory (holds step-N checkpoints)", DEFAULT_SERIES, key="series_dir"
    )
    run_dir = resolve_checkpoint(text)
    try:
        found = checkpoint_dirs(run_dir)
    except FileNotFoundError as exc:
        raise InputError(f"{exc}. A run directory holds step-N checkpoints.") from exc
    st.write(f"{len(found)} checkpoints: steps {', '.join(str(s) for s, _ in found)}")
    if not st.toggle("Analyse these checkpoints", key="series_go"):
        return
    prompt = ctx.model.tokenizer.decode(list(ctx.run.token_ids), skip_special_tokens=True)
    frame = checkpoint_series(
        str(run_dir), prompt, ctx.run.num_steps, tuple(ctx.run.seeds), series_signature(run_dir)
    )
    st.plotly_chart(figures.checkpoint_series_figure(frame), key="series_fig", width="stretch")
    st.plotly_chart(figures.loss_by_depth_figure(frame), key="series_depth", width="stretch")
    st.dataframe(frame, hide_index=True, key="series_table")
    st.download_button(
        "Download checkpoint_series.csv", frame.to_csv(index=False).encode(),
        file_name="checkpoint_series.csv", mime="text/csv", key="dl_series", on_click="ignore",
    )  # fmt: skip
