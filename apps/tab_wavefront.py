"""The Wavefront tab: generate with the diffusion-forcing sampler and show which positions each
sampler step refined (``workbench.wavefront_frame`` → ``figures.wavefront_heatmap``), and whether
its text is the one greedy decoding writes at the sidebar's steps (and why not when it differs)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from recurrent_model.criteria import freeze_strategies
from recurrent_model.diffusion import DiffusionConfig
from workbench import figures
from workbench._frames import shown_token

from . import compute, cost
from .messages import shown_as_message
from .tab_generation import generation_estimate
from .ui import Context, chart, download, estimate_gate

EXIT_LABEL = "Freeze below (relative state change per sampler step)"


def wavefront_estimate(ctx: Context, new: int, inner: int, headway: int) -> cost.CostEstimate:
    """The estimated time of one diffusion sampling at the sidebar's steps
    (compute.diffusion_estimate)."""
    steps, tokens = ctx.run.num_steps, len(ctx.run.token_ids)
    return compute.diffusion_estimate(ctx.model, tokens, new, steps, inner, headway)


def sampler_tokens(out: dict) -> tuple[list[str], list[int]]:
    """The sampler's new tokens as display text and the core iterations each position had when it
    froze, from its wavefront frame (the last frozen guess of each new position)."""
    frame = out["frame"]
    frozen = frame[frame["frozen"]].sort_values("step")
    final = frozen.groupby("position")["token"].last().sort_index().iloc[: out["new_tokens"]]
    at_freeze = frozen.groupby("position")["recurrence"].first().sort_index()
    names = out["token_text"] or {}
    texts = [names.get(int(t), str(int(t))) for t in final]
    return texts, [int(r) for r in at_freeze.loc[final.index]]


def freeze_rule(strategy: str, exit_t: float, steps: int, inner: int) -> str:
    """When the sampler freezes positions, in words (``recurrent_model.diffusion``'s rules)."""
    wait = max(steps // inner, 1)
    return {
        "latent-diff": f"up to the last one whose state changed by less than {exit_t:g} "
        "(relative) in one sampler step",
        "latent-acceleration-1": f"up to the last one whose state's acceleration fell below "
        f"{exit_t:g}",
        "latent-acceleration-2": f"up to the last one whose state's acceleration fell below "
        f"{exit_t:g}",
        "token-stability": f"once their guesses have stayed the same for {wait} sampler steps",
        "fixed": f"after {wait} sampler steps each",
    }.get(strategy, f"by its {strategy!r} rule")


def greedy_note(
    out: dict, greedy: dict, request: tuple, steps: int, init_scale: float
) -> str | None:
    """Why the sampler's text differs from greedy decoding's (None when the texts are the same):
    where they part, what greedy decoding wrote, and how the two procedures differ."""
    if out["text"] == greedy["text"]:
        return None
    _, inner, _, exit_t, strategy = request
    mine, iterations = sampler_tokens(out)
    theirs = list(greedy["table"]["token"]) if isinstance(greedy["table"], pd.DataFrame) else []
    part = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
    if part is not None:
        where = (f"from new token {part + 1} on: the sampler froze {shown_token(mine[part])} where "
                 f"greedy decoding chose {shown_token(theirs[part])}")  # fmt: skip
    else:
        where = f"in length: the sampler wrote {len(mine)} tokens, greedy decoding {len(theirs)}"
    spent = f"{min(iterations)}–{max(iterations)}" if iterations else "no"
    noise = (
        f" Both also start from random initial states (init scale {init_scale:g}), drawn "
        "separately for each run; at init scale 0 only the procedure differs."
        if init_scale > 0
        else ""
    )
    return (
        f"**This text differs from greedy decoding at {steps} steps per token** {where}. "
        f"Greedy decoding (the Generation tab with no exit criterion) wrote:\n\n"
        f"```\n{greedy['text']}\n```\n\n"
        "The diffusion sampler is another decoding procedure, not greedy decoding made faster: "
        f"greedy decoding gives every token exactly {steps} core iterations before the next one "
        "starts, while the sampler decodes each position while the positions before it are still "
        "guesses, mixes the last step's embeddings and a fresh initial state into the wave, and "
        f"freezes positions {freeze_rule(strategy, exit_t, steps, inner)}: here its new positions "
        "froze "
        f"after {spent} core iterations.{noise}"
    )


def compare_with_greedy(ctx: Context, out: dict, request: tuple) -> None:
    """Greedy decoding of as many tokens at the sidebar's steps, and the note when it differs."""
    new = out["new_tokens"]
    if new < 1:
        return
    guess = generation_estimate(ctx, new)
    what = f"Greedy decoding of {new} tokens × {ctx.run.num_steps} steps, to compare"
    if not estimate_gate(what, guess, "wf_greedy_go", (ctx.key, request)):
        return
    progress = compute.TaskProgress(f"Greedy decoding of {new} tokens", "tokens", guess)
    greedy = compute.generation(ctx.model, ctx.run.token_ids, new, ctx.run.num_steps, None,
                                None, ctx.run.init_scale, _progress=progress)  # fmt: skip
    note = greedy_note(out, greedy, request, ctx.run.num_steps, ctx.run.init_scale)
    if note is None:
        st.success(
            f"Greedy decoding at {ctx.run.num_steps} steps per token writes the same text (the "
            "Generation tab with no exit criterion: an exit criterion spends fewer steps on some "
            "tokens and may write another)."
        )
    else:
        st.info(note)


def request_form(ctx: Context, room: int) -> None:
    """The sampler's settings; pressing Sample stores them as the request."""
    with st.form("wavefront"):
        c1, c2, c3 = st.columns(3)
        new = c1.number_input("New tokens", 1, max(room, 1), min(24, max(room, 1)), key="wf_new")
        inner = c2.number_input("Inner recurrence (iterations per sampler step)", 1, 64, 4,
                                key="wf_inner")  # fmt: skip
        headway = c3.number_input("Headway (new positions per sampler step)", 1, 16, 1,
                                  key="wf_headway")  # fmt: skip
        c4, c5 = st.columns(2)
        exit_t = c4.number_input(EXIT_LABEL, 0.0, 10.0, 0.03, format="%.3f", key="wf_exit_t")
        strategies = freeze_strategies()  # the sampler's default chosen by name
        default = strategies.index(DiffusionConfig.freeze_strategy)
        strategy = c5.selectbox("Freeze strategy", strategies, index=default, key="wf_strategy")
        if st.form_submit_button("Sample"):
            st.session_state["wf_request"] = (int(new), int(inner), int(headway), float(exit_t),
                                              strategy)  # fmt: skip


def show_sample(ctx: Context, out: dict, request: tuple) -> None:
    """The sampler's text, the greedy comparison, its counts and the wavefront heatmap."""
    st.caption("Text from the diffusion sampler:")
    st.code(out["text"] or "(nothing frozen)", language=None, wrap_lines=True)
    compare_with_greedy(ctx, out, request)
    s = out["summary"]
    c1, c2, c3 = st.columns(3)
    c1.metric("Sampler steps", s["diffusion_steps"])
    c2.metric("Tokens per step", f"{out['new_tokens'] / max(s['diffusion_steps'], 1):.2f}")
    c3.metric("Positions forwarded", s["num_tokens_forward"])
    if out["frame"].empty:
        st.warning("No sampler step ran.")
        return
    chart(figures.wavefront_heatmap(out["frame"], out["frontier"], out["token_text"]),
          "wavefront_heatmap")  # fmt: skip
    frame = out["frame"]
    download("Download wavefront.csv", lambda: compute.csv_bytes(frame), "wavefront.csv",
             "dl_wavefront")  # fmt: skip


def render(ctx: Context) -> None:
    """Parallel decoding across depth: the wave of positions refined at each sampler step."""
    room = ctx.model.config.block_size - len(ctx.run.token_ids)
    request_form(ctx, room)
    request = st.session_state.get("wf_request")
    if request is None:
        st.info(
            f"Press Sample: the prompt is prefilled at {ctx.run.num_steps} steps (the sidebar's "
            "steps), then every sampler step advances the whole wave by the inner recurrence."
        )
        return
    new, inner, headway, exit_t, strategy = request
    if not 1 <= new <= room:
        st.error(f"New tokens must lie between 1 and {room} (the context left after the prompt).")
        return
    guess = wavefront_estimate(ctx, new, inner, headway)
    passes = cost.diffusion_passes(new, ctx.run.num_steps, inner, headway)
    what = (
        f"Diffusion sampling: the prefill at {ctx.run.num_steps} steps, then about {passes} "
        f"sampler passes × {inner} iterations (if each position freezes after about "
        f"{ctx.run.num_steps} iterations)"
    )
    if not estimate_gate(what, guess, "wf_go", (ctx.key, request)):
        return
    with shown_as_message():
        progress = compute.TaskProgress("Sampling with the diffusion sampler", "tokens", guess)
        out = compute.diffusion_run(ctx.model, tuple(ctx.run.token_ids), new,
                                    ctx.run.num_steps, inner, headway, exit_t, strategy,
                                    ctx.run.init_scale, _progress=progress)  # fmt: skip
        show_sample(ctx, out, request)
