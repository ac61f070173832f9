"""AppTest checks of apps/trajectories.py: every view renders, bad input is a message, caching holds.

The app opens on checkpoints/default when it exists, else on the labelled random stand-in.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import workbench
from apps import views
from apps.views import TABS
from recurrent_model.standin import DEFAULT_CHECKPOINT, FALLBACK_CONTEXT

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
TIMEOUT = 240


def context_size() -> int:
    config = DEFAULT_CHECKPOINT / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        return int(data.get("block_size", data.get("max_position_embeddings", 4096)))
    return FALLBACK_CONTEXT


def open_app(steps: int = 12, seeds: str = "0, 1, 2") -> AppTest:
    """The app after its first run, then with small settings (fast on CPU)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    at.number_input(key="steps").set_value(steps)
    at.text_input(key="seeds").set_value(seeds)
    return at.run()


def show(at: AppTest, view: str) -> AppTest:
    at.session_state["view"] = view
    return at.run()


def chart_keys(at: AppTest) -> set[str]:
    return {c.key for c in at.get("plotly_chart")}


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def app() -> AppTest:
    return open_app()


def test_opens_with_a_model_banner_charts_and_downloads(app):
    assert_clean(app)
    assert app.title[0].value == "Recurrent-depth trajectories"
    if DEFAULT_CHECKPOINT.joinpath("config.json").is_file():
        assert any("from" in c.value and "parameters" in c.value for c in app.caption)
    else:
        assert "Randomly initialised model (untrained)" in app.warning[0].value
    assert any("12 steps" in c.value and "seeds 0, 1, 2" in c.value for c in app.caption)
    assert set(TABS[0].charts) <= chart_keys(app)
    labels = {b.proto.label for b in app.get("download_button")}
    assert {"Download trajectory (.safetensors)", "Download pca_coordinates.csv"} <= labels


DOWNLOADS = {"Convergence": 4, "Path independence": 2, "Dynamics": 1, "Lenses": 1}


@pytest.mark.parametrize("tab", [t for t in TABS[1:] if t.charts], ids=lambda tab: tab.title)
def test_every_analysis_view_renders(app, tab):
    show(app, tab.title)
    view = tab.title
    assert_clean(app)
    assert set(tab.charts) <= chart_keys(app)
    if view in DOWNLOADS:
        assert len(app.get("download_button")) == DOWNLOADS[view]
    if view == "Dynamics":
        kinds = ["fixed point", "converging", "orbit", "slider", "other"]
        assert [m.label for m in app.metric] == kinds
        table = app.dataframe[0].value
        assert sum(int(m.value) for m in app.metric) == len(table)
        assert set(table["kind"]) <= set(kinds)
        assert not (table["kind"] == "fixed point")[~table["settled"]].any()
        assert any("**converging**: heading for a fixed point" in c.value for c in app.caption)
        assert any("Classified at 12 steps from seed 0" in c.value for c in app.caption)


def toy_render(ctx) -> None:
    st.markdown(f"Toy tab on {ctx.traj.n_tokens} tokens")


def test_a_tab_registered_in_views_is_drawn(app, monkeypatch):
    monkeypatch.setattr(views, "TABS", [*views.TABS, views.Tab("Toy", toy_render)])
    try:
        app.run()  # the tab bar with the toy tab: a tab can be chosen once it is drawn
        assert "Toy" in [t.label for t in app.tabs]
        show(app, "Toy")
        assert_clean(app)
        assert any(m.value.startswith("Toy tab on ") for m in app.markdown)
    finally:
        monkeypatch.undo()
        app.run()  # the tab bar without the toy tab, before a tab is chosen again
        show(app, TABS[0].title)


def test_dynamics_token_choice_redraws_its_rotation_panel(app):
    show(app, "Dynamics")
    app.selectbox(key="dyn_token").set_value(3).run()
    assert_clean(app)
    assert app.main.caption[-1].value.startswith("3: ")
    rotation = next(c for c in app.get("plotly_chart") if c.key == "rotation")
    assert "3: " in json.loads(rotation.proto.spec)["layout"]["title"]["text"]


def test_dynamics_suggests_more_steps_while_tokens_still_move(app):
    show(app, "Dynamics")
    table = app.dataframe[0].value
    moving = int(table["kind"].isin(["converging", "other"]).sum())
    assert moving >= len(table) / 4  # 12 steps: most tokens are still on their way
    assert any(f"{moving} of {len(table)} tokens have not settled in 12 steps" in i.value
               for i in app.info)  # fmt: skip
    try:
        app.button(key="dyn_more_steps").click().run()
        assert_clean(app)
        assert app.number_input(key="steps").value == 24
        assert any("24 steps" in c.value for c in app.caption)
    finally:
        app.number_input(key="steps").set_value(12).run()


def test_lens_switches_between_coda_and_logit(app):
    show(app, "Lenses")
    app.radio(key="lens_kind").set_value("logit").run()
    assert_clean(app)
    assert app.get("download_button")[0].proto.label == "Download lens_logit.csv"


def test_generation_reports_iterations_per_token(app):
    # mid-expression code: neither the trained default nor the random stand-in stops at once
    default_prompt = app.text_area(key="prompt").value
    app.text_area(key="prompt").set_value("def add(a, b):\n    return a +").run()
    try:
        show(app, "Generation")
        assert app.info and "Press Generate" in app.info[0].value
        app.number_input(key="gen_new").set_value(6)
        app.selectbox(key="gen_exit").set_value("kl")
        app.button[0].click().run()
        assert_clean(app)
        table, metric, charts = app.dataframe[0].value, app.metric[0], chart_keys(app)
    finally:
        del app.session_state["gen_request"]
        app.text_area(key="prompt").set_value(default_prompt).run()
    assert metric.label == "Mean steps per token"
    assert 1 <= len(table) <= 6
    assert ((table["steps"] >= 1) & (table["steps"] <= 12)).all()
    assert float(metric.value) == pytest.approx(table["steps"].mean(), abs=0.05)
    assert "gen_steps" in charts


@pytest.mark.parametrize(
    ("criterion", "threshold", "message"),
    [
        ("kl", -0.5, "must be positive (or 0 for the criterion's default), got -0.5"),
        ("none (fixed steps)", 1e-3, "needs an exit criterion"),
    ],
)
def test_an_unusable_exit_threshold_is_a_message(app, criterion, threshold, message):
    show(app, "Generation")
    app.selectbox(key="gen_exit").set_value(criterion)
    app.number_input(key="gen_threshold").set_value(threshold)
    app.button[0].click().run()
    try:
        assert not app.exception
        assert app.error and message in app.error[0].value
        assert "gen_steps" not in chart_keys(app)  # nothing generated with another threshold
    finally:
        del app.session_state["gen_request"]
        app.number_input(key="gen_threshold").set_value(0.0).run()


def test_umap_only_on_request(app, monkeypatch):
    class FakeUMAP:
        def __init__(self, n_components: int = 2, **kwargs) -> None:
            self.n_components = n_components

        def fit_transform(self, x: np.ndarray) -> np.ndarray:
            return x[:, : self.n_components]

    from apps import umap_worker

    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=FakeUMAP))
    # the fake is in this process: the fit runs here, not in the UMAP process
    monkeypatch.setattr(
        umap_worker.WORKER, "fit", lambda request, tick: umap_worker._answer(request)
    )
    show(app, "Trajectories")
    assert "umap_waterfall" not in chart_keys(app)
    app.toggle(key="umap").set_value(True).run()
    assert_clean(app)
    assert "umap_waterfall" in chart_keys(app)
    app.toggle(key="umap").set_value(False).run()


def test_chat_input_runs_on_the_chat_template(app):
    show(app, "Trajectories")
    app.radio(key="mode").set_value("Chat").run()
    app.text_area(key="system").set_value("You are a helpful assistant.").run()
    assert_clean(app)
    assert any("<|begin_header|>" in label for label in app.multiselect(key="traj_tokens").options)
    app.radio(key="mode").set_value("Prompt").run()


def test_token_picks_follow_the_prompt(app):
    default_prompt = app.text_area(key="prompt").value
    app.text_area(key="prompt").set_value("x = 1\ny = 22\nprint(x + y)").run()
    try:
        show(app, "Trajectories")
        app.multiselect(key="traj_tokens").set_value([2, 12]).run()
        app.text_area(key="prompt").set_value("x = 1\ny = 3").run()  # 10 tokens: 12 is gone
        assert_clean(app)
        picker = app.multiselect(key="traj_tokens")
        assert picker.value == [2]
        assert any("Dropped 12: " in i.value and "10 tokens now" in i.value for i in app.info)
        labels = list(picker.options)
        assert labels[-1] == "9: '3'" and "5: '\\n'" in labels  # fresh labels, newline escaped
        app.run()
        assert not any("Dropped" in i.value for i in app.info)  # said once
    finally:
        app.text_area(key="prompt").set_value(default_prompt).run()


def test_byte_tokens_are_labelled_by_their_bytes(app):
    default_prompt = app.text_area(key="prompt").value
    app.text_area(key="prompt").set_value("naïve\tcafé").run()
    try:
        show(app, "Trajectories")
        assert_clean(app)
        labels = app.multiselect(key="traj_tokens").options
        assert not any("\ufffd" in label or "\\ufffd" in label for label in labels), labels
        assert any("<0xC3>" in label for label in labels), labels
        assert any("'\\t'" in label for label in labels), labels
    finally:
        app.text_area(key="prompt").set_value(default_prompt).run()


@pytest.mark.parametrize(
    ("widget", "key", "value", "message"),
    [
        ("text_area", "prompt", "   ", "The prompt is empty"),
        ("text_area", "prompt", "a " * (context_size() + 1), "context holds"),
        ("number_input", "steps", 0, "Steps must be a whole number from 1 to"),
        ("number_input", "steps", 10_000, "Steps must be a whole number from 1 to"),
        ("text_input", "seeds", "0, one", "Seeds must be whole numbers"),
        ("text_input", "seeds", ", ".join(map(str, range(20))), "at most"),
        ("text_input", "seeds", "", "at least one seed"),
        ("number_input", "init_scale", -1.0, "Init scale must lie between"),
        ("text_input", "checkpoint", "/nonexistent/checkpoint", "does not exist"),
    ],
)
def test_bad_input_is_a_message(widget, key, value, message):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    getattr(at, widget)(key=key).set_value(value).run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(message in e.value for e in at.error), [e.value for e in at.error]
    assert not at.get("plotly_chart")


def test_a_directory_that_is_not_a_checkpoint_is_a_message(tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    for directory, message in [(tmp_path, "no config.json"), (tmp_path / "bad", "not valid JSON")]:
        at.text_input(key="checkpoint").set_value(str(directory)).run()
        assert not at.exception, [e.message for e in at.exception]
        assert at.error and message in at.error[0].value


def test_out_of_memory_is_a_message(monkeypatch):
    def too_large(*args, **kwargs):
        raise workbench.TrajectoryTooLarge("this collection needs about 900.00 GiB")

    monkeypatch.setattr(workbench, "collect", too_large)
    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert "Out of memory" in at.error[0].value and "900.00 GiB" in at.error[0].value


def test_changing_only_the_view_recomputes_nothing(monkeypatch):
    calls = {"collect": 0, "classify": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(workbench, "collect", counting("collect", workbench.collect))
    monkeypatch.setattr(
        workbench, "classify_dynamics", counting("classify", workbench.classify_dynamics)
    )
    st.cache_data.clear()
    at = open_app(steps=10, seeds="0, 1")
    assert calls == {"collect": 2, "classify": 0}  # defaults, then 10 steps
    show(at, "Dynamics")
    at.selectbox(key="dyn_token").set_value(1).run()
    show(at, "Convergence")
    at.selectbox(key="conv_value").set_value("relative_step").run()
    show(at, "Dynamics")
    assert_clean(at)
    assert calls == {"collect": 2, "classify": 1}
    at.number_input(key="steps").set_value(11).run()
    assert calls == {"collect": 3, "classify": 2}


def test_one_model_in_memory_in_the_checkpoints_own_dtype_by_default():
    import gc
    import weakref

    from apps import compute

    at = open_app(steps=4, seeds="0")
    stored = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text()).get("torch_dtype")
    memory = lambda: [c.value for c in at.sidebar.caption if c.value.startswith("In memory")]  # noqa: E731
    assert at.selectbox(key="dtype").value == "checkpoint's own"
    assert f"of weights in {stored or 'float32'}" in memory()[0]
    first = weakref.ref(compute.model_slot().model)
    at.selectbox(key="dtype").set_value("bfloat16").run()
    assert_clean(at)
    assert "of weights in bfloat16" in memory()[0]
    gc.collect()
    assert first() is None  # the old model is gone, not cached beside the new one
    at.selectbox(key="dtype").set_value("checkpoint's own").run()


def test_any_huginn_layout_directory_opens(tmp_path):
    from recurrent_model.standin import fallback_model

    model = fallback_model(seed=3)
    model.config.name = "saved-tiny"
    model.save_pretrained(tmp_path / "saved")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.text_input(key="checkpoint").set_value(str(tmp_path / "saved")).run()
    assert_clean(at)
    assert not at.warning  # not the random stand-in banner
    assert any("Model **saved-tiny**" in c.value for c in at.caption)
    assert "pc_pairs" in chart_keys(at)


def test_views_that_need_more_say_so():
    at = open_app(steps=5, seeds="0")
    show(at, "Path independence")
    assert_clean(at)
    assert "at least two" in at.info[0].value and not at.get("plotly_chart")
    show(at, "Dynamics")
    assert "at least 8 steps" in at.info[0].value and not at.get("plotly_chart")
    at.number_input(key="steps").set_value(8)
    at.text_input(key="seeds").set_value("0, 1")
    at.number_input(key="init_scale").set_value(0.0).run()  # s_0 = 0: one run whatever the seeds
    assert_clean(at)
    assert "rotation" in chart_keys(at)
    show(at, "Path independence")
    assert "at least two" in at.info[0].value
