"""Streamlit app: look at the latent trajectories of a recurrent-depth model in the browser.

Run ``make app`` or ``streamlit run apps/trajectories.py``. The sidebar picks the checkpoint, the
prompt (or chat) and the run (steps, seeds, init scale); the tabs show the analyses of
``workbench``. Nothing is computed here: see ``apps/compute.py`` (cached workbench calls) and
``apps/views.py`` (figures).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts apps/ on the path, not the repository root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
import torch  # noqa: E402

from apps import compute, inputs  # noqa: E402
from apps.messages import shown_as_message  # noqa: E402
from apps.views import VIEWS, Context  # noqa: E402
from recurrent_model.standin import DEFAULT_CHECKPOINT, is_fallback  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")


def devices() -> list[str]:
    """The devices torch can use here, CPU first."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


def sidebar() -> dict:
    """The sidebar widgets; returns their raw values (checked later)."""
    with st.sidebar:
        st.header("Model")
        path = st.text_input("Checkpoint directory", "checkpoints/default", key="checkpoint")
        device = st.selectbox("Device", devices(), key="device")
        dtype = st.selectbox("dtype", DTYPES, key="dtype")
        st.header("Input")
        chat = st.radio("Input as", ["Prompt", "Chat"], horizontal=True, key="mode") == "Chat"
        system = st.text_area("System message", "", key="system") if chat else ""
        prompt = st.text_area(
            "User message" if chat else "Prompt", inputs.DEFAULT_PROMPT, height=120, key="prompt"
        )
        st.header("Run")
        steps = st.number_input("Steps", value=32, step=1, key="steps")
        seeds = st.text_input("Seeds", "0, 1, 2, 3, 4", key="seeds")
        scale = st.number_input("Init scale", value=1.0, step=0.1, key="init_scale")
    return dict(
        path=path,
        device=device,
        dtype=dtype,
        chat=chat,
        system=system,
        prompt=prompt,
        steps=steps,
        seeds=seeds,
        scale=scale,
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
            f"Model **{model.name}** from `{path}` · {cfg.shape_summary()} · "
            f"{model.num_parameters() / 1e6:.1f} M parameters · {model.device} · {model.dtype}"
        )


def main() -> None:
    st.set_page_config(page_title="Recurrent-depth trajectories", layout="wide")
    st.title("Recurrent-depth trajectories")
    raw = sidebar()
    with shown_as_message(stop=True):
        path = inputs.resolve_checkpoint(raw["path"])
        model = compute.load(
            str(path), raw["device"], raw["dtype"], compute.checkpoint_signature(path)
        )
    model_banner(model, path)
    with shown_as_message(stop=True):
        run = inputs.RunSettings(
            token_ids=inputs.encode_input(
                model.tokenizer, model.config.block_size, raw["prompt"], raw["system"], raw["chat"]
            ),
            num_steps=inputs.check_steps(raw["steps"]),
            seeds=inputs.parse_seeds(raw["seeds"]),
            init_scale=inputs.check_init_scale(raw["scale"]),
        )
    model_key = f"{path}|{raw['device']}|{raw['dtype']}|{compute.checkpoint_signature(path)}"
    n_runs = 1 if run.init_scale == 0 else len(run.seeds)
    with (
        shown_as_message(stop=True),
        st.spinner(
            f"Collecting {n_runs} run(s) × {run.num_steps + 1} states × {len(run.token_ids)} "
            "tokens …",
            show_time=True,
        ),
    ):
        traj = compute.trajectory(model, model_key, run)
    st.caption(
        f"{traj.n_tokens} tokens · {traj.num_steps} steps · seeds {', '.join(map(str, traj.seeds))}"
        f" · init scale {run.init_scale:g}"
    )
    ctx = Context(model=model, model_key=model_key, traj=traj, run=run)
    for name, tab in zip(VIEWS, st.tabs(list(VIEWS), key="view", on_change="rerun")):
        if tab.open:
            with tab, shown_as_message():
                VIEWS[name](ctx)


main()
