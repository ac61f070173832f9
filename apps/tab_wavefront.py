"""The Wavefront tab: generate with the diffusion-forcing sampler and show which positions each
sampler step refined (``workbench.wavefront_frame`` → ``figures.wavefront_heatmap``)."""

from __future__ import annotations

import streamlit as st

from recurrent_model.criteria import freeze_strategies
from recurrent_model.diffusion import DiffusionConfig
from workbench import figures

from . import compute, cost
from .messages import shown_as_message
from .ui import Context, chart, download, estimate_gate


def wavefront_estimate(ctx: Context, new: int, inner: int, headway: int) -> cost.CostEstimate:
    """The estimated time of one diffusion sampling at the sidebar's steps
    (compute.diffusion_estimate)."""
    steps, tokens = ctx.run.num_steps, len(ctx.run.token_ids)
    return compute.diffusion_estimate(ctx.model, tokens, new, steps, inner, headway)


def render(ctx: Context) -> None:
    """Parallel decoding across depth: the wave of positions refined at each sampler step."""
    room = ctx.model.config.block_size - len(ctx.run.token_ids)
    with st.form("wavefront"):
        c1, c2, c3 = st.columns(3)
        new = c1.number_input("New tokens", 1, max(room, 1), min(24, max(room, 1)), key="wf_new")
        inner = c2.number_input("Inner recurrence", 1, 64, 4, key="wf_inner")
        headway = c3.number_input("Headway", 1, 16, 1, key="wf_headway")
        c4, c5 = st.columns(2)
        exit_t = c4.number_input("exit_t", 0.0, 10.0, 0.03, format="%.3f", key="wf_exit_t")
        strategies = freeze_strategies()  # the sampler's default chosen by name
        default = strategies.index(DiffusionConfig.freeze_strategy)
        strategy = c5.selectbox("Freeze strategy", strategies, index=default, key="wf_strategy")
        if st.form_submit_button("Sample"):
            st.session_state["wf_request"] = (int(new), int(inner), int(headway), float(exit_t),
                                              strategy)  # fmt: skip
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
        progress = compute.TaskProgress("Sampling with the diffusion sampler", "passes", guess)
        out = compute.diffusion_run(ctx.model, tuple(ctx.run.token_ids), new,
                                    ctx.run.num_steps, inner, headway, exit_t, strategy,
                                    ctx.run.init_scale, _progress=progress)  # fmt: skip
        st.code(out["text"] or "(nothing frozen)", language=None, wrap_lines=True)
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
