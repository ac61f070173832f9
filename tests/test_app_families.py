"""The app opens a checkpoint of every family: the banner names the family, every tab renders or
says in one line why it does not apply, and a deterministic start (Ouro) gets one run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_family_model
from streamlit.testing.v1 import AppTest

from apps.views import TABS
from recurrent_model.standin import byte_level_tokenizer

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
SKIPPED_FOR = {  # tab -> the families it says it does not serve
    "Path independence": {"ouro"},
    "Generation": {"ouro", "retrofit"},
    "Wavefront": {"ouro", "retrofit"},
    "Training": {"ouro", "retrofit"},
}


@pytest.fixture(scope="module", params=["ouro", "retrofit"])
def opened(request, tmp_path_factory) -> tuple[str, AppTest]:
    model = tiny_family_model(request.param)
    model.tokenizer = byte_level_tokenizer(model.config.vocab_size)
    directory = tmp_path_factory.mktemp(request.param) / "checkpoint"
    model.save_pretrained(directory)
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.text_input(key="checkpoint").set_value(str(directory)).run()
    at.number_input(key="steps").set_value(12).run()
    return request.param, at


def test_the_banner_names_the_family_and_a_deterministic_start_has_one_run(opened):
    family, at = opened
    assert not at.exception, [e.message for e in at.exception]
    name = {"ouro": "Ouro", "retrofit": "Retrofitted"}[family]
    assert any(f"({name} family)" in c.value for c in at.caption)
    if family == "ouro":
        assert at.text_input(key="seeds").value == "0" and at.text_input(key="seeds").disabled
        assert any("one run, no seeds" in c.value for c in at.caption)


@pytest.mark.parametrize("tab", TABS, ids=lambda tab: tab.title)
def test_every_tab_renders_or_says_why_not(opened, tab):
    family, at = opened
    at.session_state["view"] = tab.title
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    if family in SKIPPED_FOR.get(tab.title, ()):
        assert any("family" in i.value or "embedding" in i.value for i in at.info)
        return
    keys = {c.key for c in at.get("plotly_chart")}
    assert set(tab.charts) <= keys


def test_the_stability_and_patching_actions_run(opened):
    family, at = opened
    at.session_state["view"] = "Stability"
    at.run()
    at.number_input(key="stab_k").set_value(2)
    at.toggle(key="stab_go").set_value(True).run()
    assert not at.exception, [e.message for e in at.exception]
    assert {"stab_eigen", "stab_lyapunov"} <= {c.key for c in at.get("plotly_chart")}
    assert any("Huginn's adapter and sandwich" in i.value for i in at.info)
    at.session_state["view"] = "Interventions"
    at.run()
    next(b for b in at.get("button") if b.proto.label == "Run patching").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
