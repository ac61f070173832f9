"""Streamlit app: look at the latent trajectories of a recurrent-depth model in the browser.

Run ``make app`` or ``streamlit run apps/trajectories.py``. The sidebar picks the checkpoint, the
prompt (or chat) and the run (steps, seeds, init scale); the tabs show the analyses of
``workbench``. Nothing is computed here: see ``apps/compute.py`` (cached workbench calls),
``apps/views.py`` (the tabs in order) and ``apps/tab_*.py`` (one module per tab).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts apps/ on the path, not the repository root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
import torch  # noqa: E402

from apps import compute, cost, inputs, views  # noqa: E402
from apps.messages import shown_as_message  # noqa: E402
from apps.ui import Context, estimate_gate  # noqa: E402
from recurrent_model.standin import DEFAULT_CHECKPOINT, is_fallback  # noqa: E402


def devices() -> list[str]:
    """The devices torch can use here, CPU first."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


def sidebar() -> dict:
    """The model and input widgets of the sidebar; returns their raw values (checked later) and
    the slot under the model settings where the memory it occupies is written."""
    with st.sidebar:
        st.header("Model")
        path = st.text_input(
            "Checkpoint directory or hub id", "checkpoints/default", key="checkpoint"
        )
        device = st.selectbox("Device", devices(), key="device")
        dtype = st.selectbox("dtype", inputs.DTYPES, key="dtype")
        memory = st.empty()
        st.header("Input")
        chat = st.radio("Input as", ["Prompt", "Chat"], horizontal=True, key="mode") == "Chat"
        system = st.text_area("System message", "", key="system") if chat else ""
        prompt = st.text_area(
            "User message" if chat else "Prompt", inputs.DEFAULT_PROMPT, height=120, key="prompt"
        )
    return dict(
        path=path,
        device=device,
        dtype=dtype,
        chat=chat,
        system=system,
        prompt=prompt,
        memory=memory,
    )


def run_widgets(model, model_key: str, tokens: int) -> dict:
    """The sidebar's run settings. Steps and seeds start at defaults scaled to the model and this
    device (estimated collection under ~20 s), set again whenever another model is loaded."""
    missing = "steps" not in st.session_state or "seeds" not in st.session_state
    if missing or st.session_state.get("run_defaults_for") != model_key:
        steps, n_seeds = compute.run_defaults(model, tokens)
        st.session_state["steps"] = steps
        st.session_state["seeds"] = ", ".join(map(str, range(n_seeds)))
        st.session_state["run_defaults_for"] = model_key
    random_start = getattr(model, "random_initial_state", True)
    if not random_start:
        st.session_state["seeds"] = "0"
    with st.sidebar:
        st.header("Run")
        steps = st.number_input("Steps", value=None, step=1, key="steps")
        seeds = st.text_input("Seeds", "", key="seeds", disabled=not random_start)
        scale = st.number_input("Init scale", value=1.0, step=0.1, key="init_scale",
                                disabled=not random_start)  # fmt: skip
        if not random_start:
            st.caption(f"{model.family} starts every run from the embedding: one run, no seeds.")
    return dict(steps=steps, seeds=seeds, scale=scale)


def prompt_length(model, raw: dict) -> int:
    """Tokens in the typed prompt, or in the default prompt when it cannot be encoded yet."""
    for text in (raw["prompt"], inputs.DEFAULT_PROMPT):
        try:
            return len(
                inputs.encode_input(
                    model.tokenizer, model.config.block_size, text, raw["system"], raw["chat"]
                )
            )
        except inputs.InputError:
            continue
    return 64


def collect_with_progress(model, model_key: str, run, guess) -> object:
    """The trajectory, with a progress bar per run and iteration and the estimate beside it; a
    fresh collection calibrates later estimates (measured / estimated time)."""
    n_runs = 1 if run.init_scale == 0 else len(run.seeds)
    what = f"{n_runs} run(s) × {run.num_steps} steps × {len(run.token_ids)} tokens"
    progress = compute.CollectProgress(what, guess)
    return compute.trajectory(model, run, _progress=progress)


def speed_line(guess) -> str:
    """The measured speed behind the estimates, and when and under what load it was taken."""
    if guess.speed is None:
        return ""
    return (
        f"Speed: {guess.speed.describe()}; a block call {1e3 * guess.call_seconds:.2g} ms "
        "beyond its matmuls."
    )


def model_banner(model, path: Path) -> None:
    cfg = model.config
    if is_fallback(model):
        st.warning(
            f"**Randomly initialised model (untrained).** There is no checkpoint at "
            f"`{DEFAULT_CHECKPOINT.relative_to(ROOT)}` yet, so the app shows a tiny model with random "
            "weights and a byte-level tokenizer: its trajectories carry no learned structure. "
            "Enter another checkpoint directory in the sidebar, or train the default one."
        )
    else:
        st.caption(
            f"Model **{model.name}** ({getattr(model, 'family', 'Huginn')} family) from `{path}` · "
            f"{cfg.shape_summary()} · "
            f"{model.num_parameters() / 1e6:.1f} M parameters · {model.device} · {model.dtype}"
        )


def memory_line(slot, model) -> None:
    """The server process's measured memory and the model's share of it."""
    held, kind = compute.resident_bytes()
    slot.caption(
        f"In memory: {cost.format_bytes(held)} {kind} in this server process, "
        f"{cost.format_bytes(compute.model_bytes(model))} of weights in "
        f"{str(model.dtype).removeprefix('torch.')} ({model.num_parameters() / 1e6:,.1f} M "
        "parameters); one model is kept, switching frees it first."
    )


def main() -> None:
    st.set_page_config(page_title="Recurrent-depth trajectories", layout="wide")
    st.title("Recurrent-depth trajectories")
    raw = sidebar()
    with shown_as_message(stop=True):
        path = inputs.resolve_checkpoint(raw["path"])
        dtype = inputs.dtype_choice(raw["dtype"])
        model = compute.load(str(path), raw["device"], dtype, compute.checkpoint_signature(path))
    model_banner(model, path)
    memory_line(raw["memory"], model)
    model_key = model.cache_key
    raw |= run_widgets(model, model_key, prompt_length(model, raw))
    with shown_as_message(stop=True):
        run = inputs.RunSettings(
            token_ids=inputs.encode_input(
                model.tokenizer, model.config.block_size, raw["prompt"], raw["system"], raw["chat"]
            ),
            num_steps=inputs.check_steps(raw["steps"]),
            seeds=inputs.parse_seeds(raw["seeds"]),
            init_scale=inputs.check_init_scale(raw["scale"]),
        )
    with shown_as_message(stop=True):
        n_runs = 1 if run.init_scale == 0 else len(run.seeds)
        guess = compute.estimate(model, len(run.token_ids), run.num_steps, n_runs)
        st.sidebar.markdown(f"Estimated collection: {guess.describe()}")
        st.sidebar.caption(speed_line(guess))
        what = f"Collecting {n_runs} run(s) × {run.num_steps} steps × {len(run.token_ids)} tokens"
        heavy = guess.seconds > cost.HEAVY_SECONDS
        if heavy and not estimate_gate(what, guess, "collect_go", (model_key, run)):
            st.stop()
        traj = collect_with_progress(model, model_key, run, guess)
        # collected: a later, calibrated estimate of the same run must not ask again
        st.session_state.setdefault("approved_actions", set()).add(("collect_go", (model_key, run)))
    runs = f"seeds {', '.join(map(str, traj.seeds))} · init scale {run.init_scale:g}"
    if not getattr(model, "random_initial_state", True):
        runs = "one run from the embedding"
    st.caption(f"{traj.n_tokens} tokens · {traj.num_steps} steps · {runs}")
    prompt = inputs.PromptText(raw["prompt"], raw["system"], raw["chat"])
    ctx = Context(model=model, model_key=model_key, traj=traj, run=run, prompt=prompt)
    for record, tab in zip(views.TABS, st.tabs(views.titles(), key="view", on_change="rerun")):
        if tab.open:
            with tab, shown_as_message():
                reason = record.unavailable(model)
                if reason:
                    st.info(reason)
                else:
                    record.render(ctx)


main()
