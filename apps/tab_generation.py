"""The Generation tab: a greedy continuation with an adaptive exit, and the iterations per token."""

from __future__ import annotations

import streamlit as st

from recurrent_model.criteria import CRITERIA, names
from workbench import figures

from . import compute, cost
from .messages import shown_as_message
from .ui import Context, chart, quoted_tokens, table_download

#: The choices of the exit criterion: none, then the registry's criteria for generate that read
#: what Huginn has (not a learned exit gate: this tab serves Huginn's layout).
EXIT_CRITERIA = (
    "none (fixed steps)",
    *(name for name in names("generate") if not CRITERIA[name].needs_gate),
)
DEFAULT_EXIT_CRITERION = "kl"  # chosen by name, wherever the registry lists it
DEFAULT_EXIT = EXIT_CRITERIA.index(DEFAULT_EXIT_CRITERION)


NEW_TOKEN_CHOICES = (24, 16, 8, 4, 1)


def generation_estimate(ctx: Context, new_tokens: int) -> cost.CostEstimate:
    """The estimated time of generating ``new_tokens`` at the sidebar's steps (no early exit):
    the prompt at the speed of a matmul over its tokens, each new token at that of one row."""
    return compute.generation_estimate(
        ctx.model, len(ctx.run.token_ids), new_tokens, ctx.run.num_steps
    )


def default_new_tokens(ctx: Context, room: int) -> int:
    """The most new tokens (of NEW_TOKEN_CHOICES, within the context) whose estimate fits the
    app's time budget."""
    choices = tuple(n for n in NEW_TOKEN_CHOICES if n <= room) or (max(room, 1),)
    return cost.largest_within(choices, lambda n: generation_estimate(ctx, n).seconds)


def threshold_problem(criterion: str | None, threshold: float) -> str | None:
    """Why an exit threshold cannot be used as typed (None when it can): 0 means the criterion's
    default, a positive value is used as is, anything else is refused rather than replaced."""
    if threshold < 0 or threshold != threshold:
        return f"The exit threshold must be positive (or 0 for the criterion's default), got {threshold:g}."
    if criterion is None and threshold > 0:
        return "An exit threshold needs an exit criterion: pick one, or set the threshold to 0."
    return None


def request_form(ctx: Context, room: int) -> None:
    """The generation form; pressing Generate stores (new tokens, criterion, threshold)."""
    with st.form("generation"):
        new = st.number_input(
            "New tokens", value=default_new_tokens(ctx, room), step=1, key="gen_new"
        )
        if 1 <= new <= room:
            st.caption(f"Up to {int(new)} new token(s) × {ctx.run.num_steps} steps: "
                       f"{generation_estimate(ctx, int(new)).describe()}")  # fmt: skip
        crit = st.selectbox("Exit criterion", EXIT_CRITERIA, index=DEFAULT_EXIT, key="gen_exit")
        thr = st.number_input(
            "Exit threshold (0 = the criterion's default)",
            value=0.0,
            format="%.1e",
            key="gen_threshold",
        )
        if st.form_submit_button("Generate"):
            st.session_state["gen_request"] = (int(new), crit, float(thr))


def show_generation(ctx: Context, new: int, criterion: str | None, threshold: float | None) -> None:
    """Generate (with a progress bar), then the text, the mean steps and the steps per token."""
    progress = compute.TaskProgress(
        f"Generating {new} new token{'s' if new != 1 else ''}",
        "tokens",
        generation_estimate(ctx, new),
    )
    out = compute.generation(
        ctx.model,
        ctx.run.token_ids,
        new,
        ctx.run.num_steps,
        criterion,
        threshold,
        ctx.run.init_scale,
        _progress=progress,
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
    st.dataframe(quoted_tokens(table), hide_index=True, key="gen_table")
    table_download(table, "generation_steps")


def render(ctx: Context) -> None:
    """Generate a continuation with an adaptive exit and show the iterations spent per token."""
    room = ctx.model.config.block_size - len(ctx.run.token_ids)
    request_form(ctx, room)
    request = st.session_state.get("gen_request")
    if request is None:
        st.info(f"Press Generate: up to {ctx.run.num_steps} steps per token (the sidebar's steps).")
        return
    new, crit, thr = request
    if not 1 <= new <= room:
        st.error(f"New tokens must lie between 1 and {room} (the context left after the prompt).")
        return
    criterion = None if crit == EXIT_CRITERIA[0] else crit
    problem = threshold_problem(criterion, thr)
    if problem:
        st.error(problem)
        return
    with shown_as_message():
        show_generation(ctx, new, criterion, thr if thr > 0 else None)
