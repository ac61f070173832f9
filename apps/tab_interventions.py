"""The Interventions tab: activation patching, steering and rotation-plane ablation over depth.

Every computation waits for its button (a patching grid is T × (r + 1) forwards' worth of work) and
is cached in ``apps.intervention_compute``; figures come from ``workbench.figures``.
"""

from __future__ import annotations

import re

import numpy as np
import streamlit as st

from recurrent_model.hook_names import STATE, core
from tasks.arithmetic import DEFAULT_PATCHING_PAIR
from workbench import figures, pca_direction, plane_vector
from workbench._frames import printable, shown_token
from workbench.dynamics import MIN_TAIL
from workbench.patching import patching_pair

from . import intervention_compute as compute
from .ui import Context, chart, default_tokens, estimate_gate, quoted_tokens, table_download

TOOLS = ("Patching", "Steering", "Ablation")


def _init(ctx: Context) -> tuple[float, int]:
    """The sidebar's init scale and first seed: every run of an experiment shares that s_0."""
    return ctx.run.init_scale, ctx.run.seeds[0]


PAIR_SOURCES = ("Default pair", "Corrupt a token of the prompt")
PAIR_WORDS = {
    "Default pair": "The arithmetic pair (tasks.arithmetic)",
    "Corrupt a token of the prompt": "The sidebar's prompt, one token replaced",
}
METRIC_MEANING = {
    "logit_diff": "logit difference = logit(clean answer) − logit(corrupted answer)",
    "logprob": "log-probability of the clean answer",
}


def _md(text: str) -> str:
    """``text`` with markdown's special characters escaped, so that it shows as typed."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|$~<>])", r"\\\1", text)


def _quoted_text(text: str, width: int = 120) -> str:
    """``text`` in double quotes for markdown: escapes for what a reader cannot see, markdown's
    special characters escaped, cut to ``width`` characters."""
    shown = printable(text)
    return '"' + _md(shown if len(shown) <= width else shown[: width - 1] + "…") + '"'


def _pair_statement(ctx: Context, source: str) -> str:
    """The clean and corrupted prompts the chosen experiment runs, one per line in bold, for the
    top of the panel; the prompt mode shows the token and replacement last chosen in the form."""
    if source == PAIR_SOURCES[0]:
        pair = DEFAULT_PATCHING_PAIR
        return (
            f"**Clean prompt:** {_quoted_text(pair.clean)}, answer "
            f"{_md(shown_token(str(pair.answer)))}  \n"
            f"**Corrupted prompt:** {_quoted_text(pair.corrupted)}, answer "
            f"{_md(shown_token(str(pair.corrupted_answer)))}  \n"
            f'The sidebar\'s prompt is not used: choose "{PAIR_WORDS[PAIR_SOURCES[1]]}" to '
            "patch it."
        )
    position = st.session_state.get("patch_position", default_tokens(ctx.tokens, 1)[0])
    replacement = st.session_state.get("patch_replacement", "5")
    position = min(int(position), len(ctx.tokens) - 1)
    return (
        f"**Clean prompt:** the sidebar's prompt, "
        f"{_quoted_text(st.session_state.get('prompt', ''))}  \n"
        f"**Corrupted prompt:** the same with token {position} "
        f"({_md(shown_token(ctx.tokens[position]))}) replaced by {_md(shown_token(replacement))}  \n"
        "The answers are each run's own top next token."
    )


def _patch_inputs(ctx: Context, source: str, position: int, replacement: str):
    """(clean ids, corrupted ids, target, corrupted target) of the chosen experiment: the default
    arithmetic pair with its answer tokens, or the sidebar prompt with one token replaced and
    both runs' own top tokens as the answers (None: chosen by `patch_states`)."""
    if source == PAIR_SOURCES[0]:
        pair = patching_pair(ctx.model)
        return pair.clean_ids, pair.corrupted_ids, pair.target, pair.corrupted_target
    ids = ctx.run.token_ids
    corrupted = compute.corrupt(ids, position, compute.one_token(ctx.model.tokenizer, replacement))
    if corrupted == ids:
        raise ValueError("the replacement is the token already there: pick another one")
    return ids, corrupted, None, None


def _show_answers(ctx: Context, frame, clean: tuple[int, ...], corrupted: tuple[int, ...]) -> None:
    """The two runs' answers with their probabilities, and the gap the grid is normalised by."""
    scale, seed = _init(ctx)
    steps = ctx.run.num_steps
    metric = frame.attrs["metric"]
    cols = st.columns(3)
    for col, label, ids in ((cols[0], "clean", clean), (cols[1], "corrupted", corrupted)):
        token, prob = compute.answer(ctx.model, ids, steps, scale, seed)
        col.metric(f"{label} answer", shown_token(token), f"probability {prob:.3f}",
                   delta_color="off", delta_arrow="off")  # fmt: skip
    unit = "logits" if metric == "logit_diff" else "nats"
    cols[2].metric(f"gap ({figures.words(metric)})", f"{frame.attrs['gap']:.3g} {unit}")


def _patch_form(ctx: Context) -> None:
    """The prompt pair (stated above the form), the patching settings, and Run patching, which
    stores them as the request."""
    hooks = [STATE] + [core(j) for j in range(ctx.model.config.n_layers_in_recurrent_block)]
    source = st.radio(
        "Clean and corrupted prompts", PAIR_SOURCES, format_func=PAIR_WORDS.__getitem__,
        horizontal=True, key="patch_pair",
    )  # fmt: skip
    st.info(_pair_statement(ctx, source))
    with st.form("patching"):
        position = ctx.token_picker(
            "Token to corrupt (sidebar prompt only)",
            "patch_position",
            default_tokens(ctx.tokens, 1)[0],
        )
        replacement = st.text_input(
            "Replacement (one token; sidebar prompt only)", "5", key="patch_replacement"
        )
        c1, c2, c3, c4 = st.columns(4)
        hook = c1.selectbox("Hook", hooks, key="patch_hook")
        positions = c2.radio("Patch", ["each", "all"], horizontal=True, key="patch_positions")
        direction = c3.radio("Direction", ["denoising", "noising"], key="patch_direction")
        metric = c4.radio(
            "Metric", ("logit_diff", "logprob"), format_func=figures.words, key="patch_metric"
        )
        st.caption(
            f"Metric at the last position: {METRIC_MEANING['logit_diff']}, or the "
            f"{METRIC_MEANING['logprob']}; share restored = (patched − corrupted) / (clean − "
            "corrupted): 1 means the patch alone brings the clean answer back, 0 that it changes "
            "nothing."
        )
        if st.form_submit_button("Run patching"):
            request = (source, position, replacement, hook, positions, direction, metric)
            st.session_state["patch_request"] = request


def _answers_differ(ctx: Context, clean: tuple[int, ...], corrupted: tuple[int, ...]) -> bool:
    """Whether the two runs' top next tokens differ (the logit difference compares them); when
    they do not, the page says so in words and patching does not start."""
    scale, seed = _init(ctx)
    steps = ctx.run.num_steps
    answer, _ = compute.answer(ctx.model, clean, steps, scale, seed)
    other, _ = compute.answer(ctx.model, corrupted, steps, scale, seed)
    if answer != other:
        return True
    st.warning(
        f"Both runs answer {_md(shown_token(answer))}: this corruption does not change the answer, so "
        "the logit difference has no second answer to compare with. Pick another token or "
        "replacement, or the log-probability metric."
    )
    return False


def patching_panel(ctx: Context) -> None:
    """Patch the clean activation into the corrupted run at every (position, step)."""
    _patch_form(ctx)
    request = st.session_state.get("patch_request")
    if request is None:
        st.info("Press Run patching to patch the clean run into the corrupted one.")
        return
    source, position, replacement, hook, positions, direction, metric = request
    clean, corrupted, target, corrupted_target = _patch_inputs(ctx, source, position, replacement)
    if metric == "logit_diff" and target is None and not _answers_differ(ctx, clean, corrupted):
        return
    scale, seed = _init(ctx)
    steps = ctx.run.num_steps
    cells = (len(clean) if positions == "each" else 1) * (steps + 1)
    patches = compute.patches_to_run(clean, corrupted, steps, positions)
    guess, batch_size = compute.patching_plan(ctx.model, len(clean), steps, patches)
    what = (
        f"Patching: {patches} patches × up to {steps} steps, {batch_size} per batch (of "
        f"{cells} cells; those before the corrupted token and at s_0 cannot change)"
    )
    if not estimate_gate(what, guess, "patch_go", (ctx.key, request)):
        return
    progress = compute.TaskProgress(f"Patching {patches} patches", "patches", guess)
    frame = compute.patching(
        ctx.model, clean, corrupted, steps, hook, positions, direction, scale,
        seed, metric, target, corrupted_target, batch_size=batch_size, _progress=progress,
    )  # fmt: skip
    _show_answers(ctx, frame, clean, corrupted)
    if frame.gap_too_small.iloc[0]:
        st.warning(
            f"The clean and corrupted runs differ by {abs(frame.attrs['gap']):.2g} in "
            f"{figures.words(metric)}, below {frame.attrs['min_gap']:g}: there is no difference "
            "in answer to restore, and the share restored would divide noise by a small number. "
            "The grid is not drawn; pick a corruption that changes the answer."
        )
    else:
        chart(figures.patching_heatmap(frame), "patch_heatmap")
    table_download(frame, "patching")


def _direction(ctx: Context, source: str, steps: int) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(vector, plane or None, a key naming them for the estimate's approval) for the chosen
    direction source."""
    if source == "Difference of means":
        a = st.text_area("Prompts A (one per line)", "I love this\nWhat a joy", key="steer_a")
        b = st.text_area("Prompts B (one per line)", "I hate this\nWhat a pain", key="steer_b")
        pa = tuple(line for line in a.splitlines() if line.strip())
        pb = tuple(line for line in b.splitlines() if line.strip())
        if not pa or not pb:
            raise ValueError("enter at least one prompt in each set")
        v = compute.mean_difference(ctx.model, pa, pb, steps)
        return v, None, f"means|{pa}|{pb}"
    if source == "PCA component":
        k = st.number_input("Component (0 = PC1)", 0, 20, 0, key="steer_pc")
        v = pca_direction(ctx.traj.raw_states[0], int(k))
        return v, None, f"pca|{k}|{ctx.key}"
    position = ctx.token_picker(
        "Token whose rotation plane", "steer_plane_token", default_tokens(ctx.tokens, 1)[0]
    )
    plane = compute.token_plane(ctx.model, ctx.run.token_ids, steps, position)
    angle = st.slider("Vector angle in the plane (rad)", 0.0, 6.28, 0.0, key="steer_angle")
    return plane_vector(plane, angle).numpy(), plane, f"plane|{position}|{angle}"


def steering_panel(ctx: Context) -> None:
    """Add α·v (or rotate a plane) at iterations i … j; the next-token effect and a continuation."""
    steps = ctx.run.num_steps
    st.caption(f"Steering runs on the sidebar's prompt ({len(ctx.run.token_ids)} tokens).")
    source = st.radio(
        "Direction", ["Difference of means", "PCA component", "Rotation plane"],
        horizontal=True, key="steer_source",
    )  # fmt: skip
    if source == "Rotation plane" and steps < MIN_TAIL:
        st.info(f"A rotation plane needs at least {MIN_TAIL} steps; raise the step count.")
        return
    vector, plane, key = _direction(ctx, source, steps)
    mode = "add"
    if plane is not None:
        mode = st.radio("Mode", ["add", "rotate"], horizontal=True, key="steer_mode")
    first, last = st.slider("Iterations", 1, max(steps, 1), (1, max(steps, 1)), key="steer_steps")
    norm = float(np.linalg.norm(ctx.traj.raw_states[0][-1], axis=-1).mean())
    if mode == "rotate":
        amount = st.slider("Rotation angle (rad)", -3.14, 3.14, 1.57, key="steer_rotate")
    else:
        amount = st.number_input(
            f"α (mean ‖s_r‖ here: {norm:.1f}; ‖v‖ = {np.linalg.norm(vector):.2f})",
            value=float(np.round(0.1 * norm / max(np.linalg.norm(vector), 1e-12), 3)),
            key="steer_alpha",
        )
    args = (
        ctx.model, ctx.run.token_ids, steps, vector, plane, mode,
        float(amount), (int(first), int(last)),
    )  # fmt: skip
    tokens = len(ctx.run.token_ids)
    guess = compute.steering_estimate(ctx.model, tokens, steps, mode, float(amount))
    what = f"Steering: {compute.steering_forwards(mode, float(amount))} forwards × {steps} steps"
    if not estimate_gate(what, guess, "steer_go", (ctx.key, key, mode, float(amount), first, last)):
        return
    progress = compute.TaskProgress("Steering", "forwards", guess)
    result = compute.steering(*args, _progress=progress)
    effect = result["effect"]
    c1, c2 = st.columns(2)
    c1.metric("KL(baseline ‖ steered)", f"{effect.kl:.4g}")
    c2.metric("Δ log p(baseline top token)", f"{effect.logprob_change:+.4g}")
    st.caption(
        f"Both at the last position: {effect.measure}. Mean KL over every position: "
        f"{effect.kl_from(0):.3g} (the ablation tool's measure, from its token on)."
    )
    top = quoted_tokens(quoted_tokens(effect.top_k, "baseline_token"), "steered_token")
    st.dataframe(top.rename(columns=figures.words), hide_index=True, key="steer_topk")
    if result["sweep"] is not None:
        chart(figures.steering_sweep_figure(result["sweep"]), "steer_sweep")
    room = ctx.model.config.block_size - len(ctx.run.token_ids)
    new = st.number_input("New tokens", 1, max(room, 1), min(16, max(room, 1)), key="steer_new")
    gen = compute.steered_text_estimate(ctx.model, tokens, int(new), steps)
    st.caption(f"Two greedy continuations of {int(new)} tokens × {steps} steps: {gen.describe()}")
    if st.button("Generate with and without steering", key="steer_generate"):
        progress = compute.TaskProgress("Generating with and without steering", "forwards", gen)
        base, steered = compute.steered_text(*args, int(new), _progress=progress)
        st.text_area("Without steering", base, disabled=True, key="steer_base_text")
        st.text_area("With steering", steered, disabled=True, key="steer_text")


def ablation_panel(ctx: Context) -> None:
    """Project a token's rotation plane out at every iteration; compare with random planes."""
    steps = ctx.run.num_steps
    if steps < MIN_TAIL:
        st.info(f"A rotation plane needs at least {MIN_TAIL} steps; raise the step count.")
        return
    tokens = len(ctx.run.token_ids)
    with st.form("ablation"):
        position = ctx.token_picker("Token", "ablate_token", default_tokens(ctx.tokens, 1)[0])
        planes = compute.default_random_planes(ctx.model, tokens, steps)
        n_random = st.number_input("Random planes (control)", 2, 256, planes, key="ablate_random")
        st.caption(
            f"{planes} control planes by default: the most of "
            f"{', '.join(map(str, compute.RANDOM_PLANE_CHOICES))} whose ablation fits the app's "
            "time budget on this model and device."
        )
        go = st.form_submit_button("Run ablation")
    if go:
        st.session_state["ablate_request"] = (position, int(n_random))
    request = st.session_state.get("ablate_request")
    if request is None:
        st.info("Pick a token and press Run ablation (its plane is fitted on raw states, s_0 = 0).")
        return
    guess, batch_size = compute.ablation_plan(ctx.model, tokens, steps, request[1])
    what = (
        f"Ablation: the token's plane and {request[1]} random planes × {steps} steps, "
        f"{batch_size} per batch"
    )
    if not estimate_gate(what, guess, "ablate_go", (ctx.key, request)):
        return
    progress = compute.TaskProgress("Ablating", "planes", guess)
    res = compute.ablation(
        ctx.model, ctx.run.token_ids, steps, *request, batch_size=batch_size,
        _progress=progress,
    )  # fmt: skip
    c1, c2, c3 = st.columns(3)
    c1.metric("Effect of the token's plane", f"{res.effect:.4g}")
    c2.metric("Random planes", f"{res.control_mean:.4g} ± {res.control_std:.2g}")
    c3.metric("Percentile among random", f"{res.percentile:.0f} %")
    st.caption(
        f"Effect = {res.measure}. At the last position only (the steering tool's measure): "
        f"{res.effect_last:.3g} against random {np.mean(res.control_last):.3g}, percentile "
        f"{res.percentile_last:.0f} %."
    )
    chart(figures.ablation_control_figure(res.table), "ablate_hist")
    table_download(res.table, "ablation")


def render(ctx: Context) -> None:
    """Patching, steering and ablation over the recurrence (one tool at a time)."""
    tool = st.radio("Tool", TOOLS, horizontal=True, key="intervention_tool")
    {"Patching": patching_panel, "Steering": steering_panel, "Ablation": ablation_panel}[tool](ctx)
