"""The Compare tab: a second checkpoint beside the sidebar's, the same prompt through both
(convergence, dynamics kinds per token and one PCA of both trajectories side by side), and two
corpus runs compared as ``python -m workbench.corpus compare`` compares them.

The second model is read from its files first: its weights' bytes and its trajectory's are shown
beside the first model's and refused in one line when they would not fit. The last comparison
drawn is kept for the Bundle tab (``LAST_COMPARISON``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from workbench import figures
from workbench.bundle import config_hash
from workbench.corpus.compare import format_comparison
from workbench.dynamics import MIN_TAIL
from workbench.figures import compare as compare_figures

from . import compare_compute, compute, inputs
from .compute import csv_bytes
from .messages import describe
from .progress import CollectProgress
from .tab_corpus import CorpusDir, default_dir, is_corpus_dir, resolve_dir
from .tab_dynamics import shown_kinds
from .ui import Context, chart, download, estimate_gate

LAST_COMPARISON = "compare_last"
BOOTSTRAP_CHOICES = (200, 1000, 2000)


@dataclass
class Comparison:
    """Two models on one prompt as drawn: for ``first_key`` (the sidebar's model and run), the
    second model's settings, the frames and the figures (what a bundle of the app holds)."""

    first_key: tuple
    settings: dict[str, Any]
    frames: dict[str, pd.DataFrame]
    figures: dict[str, go.Figure]


def render(ctx: Context) -> None:
    """Two checkpoints on the sidebar's prompt, then two corpus runs."""
    st.subheader("Two checkpoints, one prompt")
    in_one_line(models_section, ctx)
    st.subheader("Two corpus runs")
    in_one_line(corpus_section)


def in_one_line(section, *args) -> None:
    """Draw ``section``; an expected error (a bad checkpoint, prompt or run) is one line and the
    next section is still drawn."""
    try:
        section(*args)
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise
        st.error(message)


def second_settings(ctx: Context) -> tuple[str, int]:
    """The second checkpoint as typed and its steps (empty: the sidebar's)."""
    left, right = st.columns([3, 1])
    text = left.text_input(
        "Second checkpoint directory or hub id", "", key="cmp_checkpoint",
        placeholder="e.g. checkpoints/default/series/step-0001200 or an org/name hub id",
    )  # fmt: skip
    steps = right.number_input(
        "Steps for the second", value=None, min_value=1, max_value=inputs.MAX_STEPS, step=1,
        key="cmp_steps", placeholder=f"{ctx.run.num_steps} (the sidebar's)",
    )  # fmt: skip
    return text, int(steps) if steps is not None else ctx.run.num_steps


def models_section(ctx: Context) -> None:
    """Load (or refuse) the second model, collect its trajectory on the same prompt, draw both."""
    text, steps = second_settings(ctx)
    if not text.strip():
        st.info(
            "Enter a second checkpoint (a directory or hub id, any family) to run the sidebar's "
            "prompt through both models; the sidebar's own checkpoint with other steps compares "
            "two depths of one model."
        )
        return
    if ctx.prompt is None:
        st.info("This page has no prompt text to give the second model's tokenizer.")
        return
    device = str(st.session_state.get("device", ctx.model.device))
    dtype = inputs.dtype_choice(st.session_state.get("dtype", inputs.OWN_DTYPE))
    found = compare_compute.read_checkpoint(inputs.resolve_checkpoint(text), dtype)
    key = found.key(device)
    first_run = ctx.run
    runs = 1  # the first run (seed) of the sidebar's: what every view here draws
    # the prompt's length as the first tokenizer reads it: the second's is known once it is loaded
    tokens = len(first_run.token_ids)
    trajectory = compare_compute.trajectory_bytes(runs, steps, tokens, found.hidden_size)
    plan = compare_compute.memory_plan(ctx.model, found, key, trajectory, device)
    st.caption(plan.line())
    if not plan.fits:
        st.error(plan.refusal())
        return
    model = ctx.model if key == ctx.model_key else compare_compute.load_second(found, device, key)
    prompt = ctx.prompt
    run = inputs.RunSettings(
        token_ids=inputs.encode_input(
            model.tokenizer, model.config.block_size, prompt.prompt, prompt.system, prompt.chat
        ),
        num_steps=inputs.check_steps(steps),
        seeds=first_run.seeds[:1],
        init_scale=first_run.init_scale,
    )
    guess = compute.estimate(model, len(run.token_ids), run.num_steps, runs)
    what = (
        f"Collecting the second model: 1 run × {run.num_steps} steps × {len(run.token_ids)} tokens"
    )
    if not estimate_gate(what, guess, "cmp_go", (key, run)):
        return
    progress = CollectProgress(
        f"1 run × {run.num_steps} steps × {len(run.token_ids)} tokens", guess
    )
    traj = compute.trajectory(model, run, _progress=progress)
    other = Context(model=model, model_key=key, traj=traj, run=run, prompt=prompt)
    draw_pair(ctx, other, found)


def names(first: Context, second: Context, found: compare_compute.Checkpoint) -> tuple[str, str]:
    """Panel titles that tell the two apart: the checkpoint's folder name first (two checkpoints
    of one training run share a model name), then the model, its family and steps."""
    folders = (Path(st.session_state.get("checkpoint", "")).name, Path(found.path).name)
    return tuple(
        f"{tag}: {folder} · {c.model.name} ({getattr(c.model, 'family', 'Huginn')}), "
        f"{c.traj.num_steps} steps"
        for tag, folder, c in zip("AB", folders, (first, second))
    )  # type: ignore[return-value]


def aligned(first: Context, second: Context) -> bool:
    """Whether both models read the prompt as the same tokens (same ids, same texts)."""
    return (
        tuple(first.traj.token_ids) == tuple(second.traj.token_ids)
        and first.tokens == second.tokens
    )


def draw_pair(first: Context, second: Context, found: compare_compute.Checkpoint) -> None:
    """Convergence, kinds and the joint PCA side by side; the comparison kept for a bundle."""
    pair = names(first, second, found)
    same = aligned(first, second)
    st.caption(f"**A** is the sidebar's model, **B** `{found.path}`; both from {first.start}.")
    if not same:
        st.caption(
            f"The tokenizers disagree on this prompt (A: {first.traj.n_tokens} tokens, B: "
            f"{second.traj.n_tokens}): each panel labels its own tokens, none are aligned."
        )
    value = st.selectbox("Colour", ["distance_to_final", "relative_step"],
                         format_func=figures.words, key="cmp_value")  # fmt: skip
    conv_a = compute.convergence(first.traj, first.tokens)
    conv_b = compute.convergence(second.traj, second.tokens)
    built = {"compare_convergence": figures.convergence_pair(conv_a, conv_b, pair, value, same)}
    chart(built["compare_convergence"], "cmp_convergence")
    frames = {"compare_convergence_a": conv_a, "compare_convergence_b": conv_b}
    if min(first.traj.num_steps, second.traj.num_steps) >= MIN_TAIL:
        kinds_a = shown_kinds(compute.dynamics(first.traj, first.tokens))
        kinds_b = shown_kinds(compute.dynamics(second.traj, second.tokens))
        built["compare_kinds"] = figures.kinds_pair(
            list(kinds_a), list(kinds_b), first.tokens, second.tokens, pair, same
        )
        chart(built["compare_kinds"], "cmp_kinds")
        frames["compare_kinds"] = kinds_table(first, second, list(kinds_a), list(kinds_b), same)
    else:
        st.info(f"The dynamics kinds need at least {MIN_TAIL} steps in both runs.")
    coords_a, coords_b, ratios = compare_compute.joint_pca(first.traj, second.traj)
    built["compare_pca"] = figures.joint_pca_pair(
        coords_a, coords_b, first.tokens, second.tokens, pair, ratios, joint=ratios is not None
    )
    chart(built["compare_pca"], "cmp_pca")
    st.caption(
        "One PCA of both models' states puts them in one space; the axes mean the same in both "
        "panels only where the models share a residual basis (checkpoints of one training run, "
        "one model at two step counts)."
    )
    frames["compare_pca"] = pd.concat([
        compare_compute.pca_frame(coords_a, first.tokens, "A"),
        compare_compute.pca_frame(coords_b, second.tokens, "B"),
    ], ignore_index=True)  # fmt: skip
    table_downloads(frames, "")
    st.session_state[LAST_COMPARISON] = Comparison(
        first.key, second_model_settings(second, found), frames, built
    )


def table_downloads(frames: dict[str, pd.DataFrame], prefix: str) -> None:
    """One CSV download per frame in a row, each labelled by the frame's name."""
    st.caption("Download the tables as CSV:")
    for column, (name, frame) in zip(st.columns(len(frames)), frames.items()):
        with column:
            download(f"{name.removeprefix('compare_')}.csv", lambda frame=frame: csv_bytes(frame),
                     f"{prefix}{name}.csv", f"dl_{prefix}{name}")  # fmt: skip


def kinds_table(
    first: Context, second: Context, kinds_a: list[str], kinds_b: list[str], same: bool
) -> pd.DataFrame:
    """Each token's kind in both models: one row per position when aligned, else each model's
    own rows."""
    if same:
        table = pd.DataFrame({"position": range(first.traj.n_tokens), "token": first.tokens,
                              "kind_a": kinds_a, "kind_b": kinds_b})  # fmt: skip
        st.caption(
            f"{sum(a != b for a, b in zip(kinds_a, kinds_b))} of {len(kinds_a)} tokens change kind "
            "from A to B."
        )
        return table
    return pd.concat([
        pd.DataFrame({"model": "A", "position": range(len(kinds_a)), "token": first.tokens,
                      "kind": kinds_a}),
        pd.DataFrame({"model": "B", "position": range(len(kinds_b)), "token": second.tokens,
                      "kind": kinds_b}),
    ], ignore_index=True)  # fmt: skip


def second_model_settings(second: Context, found: compare_compute.Checkpoint) -> dict[str, Any]:
    """What a bundle records of the second model."""
    return {
        "second_model": str(second.model.name),
        "second_checkpoint": found.path,
        "second_family": found.family,
        "second_config_hash": config_hash(second.model.config),
        "second_num_steps": second.traj.num_steps,
        "second_seeds": list(second.traj.seeds),
        "second_dtype": str(second.model.dtype).removeprefix("torch."),
    }


def corpus_section() -> None:
    """Two corpus run directories: their comparison's tables and figures."""
    left, right, boot = st.columns([2, 2, 1])
    text_a = left.text_input("First corpus run", default_dir(), key="cmp_corpus_a")
    text_b = right.text_input("Second corpus run", "", key="cmp_corpus_b",
                              placeholder="another corpus result directory")  # fmt: skip
    n_boot = boot.selectbox("Bootstrap resamples", BOOTSTRAP_CHOICES, index=1, key="cmp_boot")
    paths = [resolve_dir(t) for t in (text_a, text_b)]
    missing = [
        str(p) for t, p in zip((text_a, text_b), paths) if t.strip() and not is_corpus_dir(p)
    ]
    if missing:
        st.info(f"No corpus run (no corpus manifest.json) in {', '.join(missing)}.")
        return
    if not (text_a.strip() and text_b.strip()):
        st.info(
            "Enter two corpus result directories (`python -m workbench.corpus run`) to compare "
            "their dynamics kinds, steps, λ_1 and lens KL."
        )
        return
    frames = compare_compute.corpus_comparison(CorpusDir(paths[0]), CorpusDir(paths[1]), n_boot)
    st.dataframe(frames["runs"], hide_index=True, key="cmp_corpus_runs")
    st.dataframe(frames["pairs"], hide_index=True, key="cmp_corpus_pairs")
    built = list(compare_figures.comparison_figures(frames).items())
    for row in range(0, len(built), 2):
        for column, (name, fig) in zip(st.columns(2), built[row : row + 2]):
            with column:
                chart(fig, f"cmp_corpus_{name}")
    with st.expander("Every table with its differences and intervals, as the command prints them"):
        st.code(format_comparison(frames), language=None)
    names = ("runs", "pairs", "kinds", "steps", "lambda_1", "lens")
    table_downloads({name: frames[name] for name in names}, "corpus_compare_")
