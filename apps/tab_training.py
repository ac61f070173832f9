"""The Training tab: dynamics across training, ``workbench.checkpoint_series`` on the current prompt.

Reads the ``step-N`` checkpoints of a run directory (by default the intermediate checkpoints kept with
the default model in ``checkpoints/default/series``) and shows loss per depth, dynamics shares,
path-independence spread and token correlation of the prompt at each training step.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from recurrent_model.config import RecurrentConfig
from workbench import figures
from workbench.checkpoint_series import checkpoint_dirs
from workbench.figures import stability as stability_figures

from . import compute, cost, stability_compute
from .inputs import InputError, resolve_checkpoint
from .ui import Context, chart, table_download

DEFAULT_SERIES = "checkpoints/default/series"


def series_estimate(ctx: Context, found: list[tuple[int, Path]]) -> tuple[cost.CostEstimate, str]:
    """The estimated time of the checkpoint series on the current prompt, at this device's speed
    in the app model's dtype, and what it counts (checkpoints × depths × texts, plus the seeds)."""
    config = RecurrentConfig.from_json(found[0][1] / "config.json")
    r = config.mean_recurrence
    depths = tuple(sorted({1, 2, 4, r, 2 * r, 4 * r}))  # checkpoint_series' default depths
    tokens, steps, seeds = len(ctx.run.token_ids), ctx.run.num_steps, len(ctx.run.seeds)
    flops = cost.checkpoint_series_flops(config, tokens, depths, steps, seeds, len(found))
    calls = cost.checkpoint_series_calls(config, depths, steps, seeds, len(found))
    what = (
        f"{len(found)} checkpoints × {len(depths)} depths (up to {max(depths)}) × 1 text, and "
        f"{seeds} seed{'s' if seeds != 1 else ''} at {steps} steps each (loading not counted)"
    )
    guess = compute.estimate_flops(ctx.model, flops, rows=tokens, calls=calls, action="series")
    return guess, what


def stability_series_estimate(ctx: Context, found: list[tuple[int, Path]]) -> cost.CostEstimate:
    """The series with every token's λ_1 as well: per checkpoint, the steps of one forward and
    the JVP of each (:func:`stability_compute.jvp_passes` plain passes), over the prompt's tokens."""
    config = RecurrentConfig.from_json(found[0][1] / "config.json")
    r = config.mean_recurrence
    depths = tuple(sorted({1, 2, 4, r, 2 * r, 4 * r}))
    tokens, steps, seeds = len(ctx.run.token_ids), ctx.run.num_steps, len(ctx.run.seeds)
    jvp_cost = stability_compute.jvp_passes(ctx.model, tokens)
    passes = int(steps * (1 + jvp_cost))
    flops = cost.checkpoint_series_flops(config, tokens, depths, steps, seeds, len(found))
    flops += len(found) * cost.forward_flops(config, tokens, passes)
    calls = cost.checkpoint_series_calls(config, depths, steps, seeds, len(found))
    calls += len(found) * cost.forward_calls(config, passes)
    return compute.estimate_flops(
        ctx.model, flops, rows=tokens, calls=calls, action="series stability"
    )


def render(ctx: Context) -> None:
    """Loss per depth and dynamics of the current prompt across a run's saved checkpoints."""
    st.caption(
        "Every saved checkpoint of a training run, in step order, run on the current prompt: "
        "loss at each depth, the share of settled fixed points / converging / orbits / sliders / "
        "other (the Dynamics tab's labels, first seed), the spread between seeds and the token "
        f"correlation at {ctx.run.num_steps} steps, seeds {', '.join(map(str, ctx.run.seeds))}, "
        "init scale 1."
        + (
            ""
            if ctx.run.init_scale == 1.0
            else f" The other tabs use init scale {ctx.run.init_scale:g}, so their labels can differ."
        )
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
    guess, what = series_estimate(ctx, found)
    st.caption(f"{what}: {guess.describe()}")
    if not st.toggle("Analyse these checkpoints", key="series_go"):
        return
    prompt = ctx.model.tokenizer.decode(list(ctx.run.token_ids), skip_special_tokens=True)
    progress = compute.TaskProgress("Analysing the checkpoints", "checkpoints", guess)
    frame = compute.checkpoint_series(
        compute.CheckpointRun(run_dir), prompt, ctx.run.num_steps, tuple(ctx.run.seeds),
        _progress=progress,
    )  # fmt: skip
    chart(figures.checkpoint_series_figure(frame), "series_fig")
    chart(figures.loss_by_depth_figure(frame), "series_depth")
    st.dataframe(frame, hide_index=True, key="series_table")
    table_download(frame, "checkpoint_series")
    stability = "λ_1 and the share of stable tokens per checkpoint (slower)"
    slower = stability_series_estimate(ctx, found)
    if st.toggle(f"{stability}: {slower.describe()}", key="series_stability"):
        progress = compute.TaskProgress("λ_1 of every checkpoint", "checkpoints", slower)
        stable = compute.checkpoint_series(
            compute.CheckpointRun(run_dir), prompt, ctx.run.num_steps, tuple(ctx.run.seeds),
            stability=True, _progress=progress,
        )  # fmt: skip
        chart(stability_figures.stability_series_figure(stable), "series_stability_fig")
