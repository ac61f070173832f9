"""AppTest of the Corpus tab: a small corpus run on the shipped model opens as figures and a
filterable token table, a directory without a run is one line, and choosing a row opens its prompt
at its position in the other tabs (where the Dynamics tab classifies the same trajectory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.proto.WidgetStates_pb2 import WidgetStates
from streamlit.testing.v1 import AppTest

from apps.tab_corpus import default_dir
from workbench import corpus
from workbench.corpus import Job, Settings

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
STEPS = 16


@pytest.fixture(scope="module")
def corpus_run(shipped_model, tmp_path_factory) -> Path:
    """Two prompts of the held-out depth and code sets, cut to 12 tokens, 2 seeds at 16 steps."""
    job = Job("depth,code", Settings(STEPS, (0, 1), ("dynamics",)), per_source=2, max_tokens=12)
    out = tmp_path_factory.mktemp("corpus") / "run"
    return corpus.run(shipped_model, job, out, progress=False)


@pytest.fixture(scope="module")
def app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(8)
    at.text_input(key="seeds").set_value("0").run()
    at.session_state["view"] = "Corpus"
    return at.run()


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def open_dir(at: AppTest, path: Path) -> AppTest:
    at.session_state["view"] = "Corpus"
    return at.text_input(key="corpus_dir").set_value(str(path)).run()


def choose_row(at: AppTest, key: str, row: int) -> AppTest:
    """Select one row of a keyed st.dataframe, as a click does in the browser (AppTest has no
    selection API: the widget state is sent with the next run)."""
    table = next(d for d in at.dataframe if d.key == key)
    states: WidgetStates = at._tree.get_widget_states()
    state = states.widgets.add()
    state.id = table.proto.id
    state.string_value = json.dumps({"selection": {"rows": [row], "columns": [], "cells": []}})
    return at._run(states)


def test_the_default_directory_is_the_newest_corpus_run_under_runs(tmp_path):
    assert default_dir(tmp_path) == "runs/corpus"
    (tmp_path / "runs" / "train" / "step-1").mkdir(parents=True)
    (tmp_path / "runs" / "train" / "step-1" / "manifest.json").write_text('{"files": {}}')
    assert default_dir(tmp_path) == "runs/corpus"  # a checkpoint's manifest is no corpus run
    found = tmp_path / "runs" / "sweep" / "code"
    found.mkdir(parents=True)
    (found / "manifest.json").write_text('{"model": {}, "settings": {}, "data": {}}')
    assert default_dir(tmp_path) == "runs/sweep/code"


def test_a_directory_without_a_corpus_run_is_one_line(app, tmp_path):
    open_dir(app, tmp_path)
    assert_clean(app)
    assert len(app.info) == 1 and "holds no corpus run" in app.info[0].value
    assert "\n" not in app.info[0].value
    assert not [c for c in app.get("plotly_chart") if c.key.startswith("corpus_")]


def test_figures_and_a_filterable_token_table(app, corpus_run):
    frame = corpus.load(corpus_run)
    open_dir(app, corpus_run)
    assert_clean(app)
    keys = {c.key for c in app.get("plotly_chart")}
    assert {"corpus_by_source", "corpus_by_category", "corpus_periods", "corpus_steps"} <= keys
    shares = next(c for c in app.get("plotly_chart") if c.key == "corpus_by_source")
    names = [t["name"] for t in json.loads(shares.proto.spec)["data"]]
    assert names[:2] == ["fixed point (settled)", "converging"]
    table = next(d for d in app.dataframe if d.key == "corpus_table").value
    assert len(table) == len(frame)
    unsettled = (frame["kind"] == "fixed_point") & ~frame["settled"]
    assert (table["kind"] == "converging").sum() == unsettled.sum()
    assert table["token"].str.match(r"^'.*'$").all() and "' '" in set(table["token"])
    app.multiselect(key="corpus_source").set_value(["code"]).run()
    table = next(d for d in app.dataframe if d.key == "corpus_table").value
    assert set(table["source"]) == {"code"} and len(table) == (frame["source"] == "code").sum()
    app.multiselect(key="corpus_source").set_value([]).run()


def test_choosing_a_row_opens_its_prompt_at_its_position(app, corpus_run):
    prompts = corpus.load_prompts(corpus_run)
    whole = prompts[prompts["tokens"] < 12].iloc[0]  # not cut: the app runs the same tokens
    open_dir(app, corpus_run)
    table = next(d for d in app.dataframe if d.key == "corpus_table").value
    picks = table[(table["prompt_id"] == whole["prompt_id"]) & (table["seed"] == 1)]
    row = picks.iloc[3]
    choose_row(app, "corpus_table", int(row.name))
    assert_clean(app)
    assert app.text_area(key="prompt").value == whole["text"]
    assert app.number_input(key="steps").value == STEPS
    assert app.text_input(key="seeds").value == "1, 0"  # the row's seed first
    message = app.success[0].value
    assert f"at position {row['position']}" in message and whole["prompt_id"] in message
    app.session_state["view"] = "Dynamics"
    app.run()
    assert_clean(app)
    assert app.selectbox(key="dyn_token").value == row["position"]
    dynamics = app.dataframe[0].value
    assert dynamics["kind"].iloc[row["position"]] == row["kind"]
    for key, view in (("stab_token", "Stability"), ("traj_tokens", "Trajectories")):
        app.session_state["view"] = view  # a second tab still shows the position
        app.run()
        assert_clean(app)
        picked = app.session_state[key]
        assert picked == ([row["position"]] if key == "traj_tokens" else row["position"])
