"""AppTest checks of the Interventions tab: patching, steering and ablation render their numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
TIMEOUT = 240


@pytest.fixture(scope="module")
def app() -> AppTest:
    """The app on a short prompt, 12 steps, one seed, showing the Interventions tab."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["prompt"] = "Claire makes a 3 egg omelet."
    at.session_state["view"] = "Interventions"
    at.run()  # the first run sets the sidebar's scaled defaults; then the small settings
    assert not at.exception, at.exception
    at.number_input(key="steps").set_value(12)
    at.text_input(key="seeds").set_value("0")
    at.run()
    assert not at.exception, at.exception
    assert any("12 steps" in c.value for c in at.caption)
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def charts(at: AppTest) -> set[str]:
    return {c.key for c in at.get("plotly_chart")}


def test_patching_runs_on_request_and_draws_the_grid(app):
    assert_clean(app)
    assert any("Run patching" in i.value for i in app.info)
    app.text_input(key="patch_replacement").set_value("5")
    app.button[0].click().run()
    assert_clean(app)
    assert "patch_heatmap" in charts(app)
    assert any(b.proto.label == "Download patching.csv" for b in app.get("download_button"))
    shown = {m.label: m.value for m in app.metric}  # the default pair's answers above the grid
    assert shown["clean answer"] == "7" and shown["corrupted answer"] == "5"
    assert float(shown["gap (logit_diff)"].split()[0]) >= 1.0


def test_a_replacement_of_several_tokens_is_a_message(app):
    app.radio(key="patch_pair").set_value("Corrupt a token of the prompt")
    app.text_input(key="patch_replacement").set_value(" omelet breakfast")
    app.button[0].click().run()
    assert not app.exception
    assert app.error and "exactly one token" in app.error[0].value
    app.text_input(key="patch_replacement").set_value("5")
    app.button[0].click().run()


def test_steering_shows_the_effect_and_a_sweep(app):
    app.radio(key="intervention_tool").set_value("Steering").run()
    assert_clean(app)
    labels = [m.label for m in app.metric]
    assert "KL(baseline ‖ steered)" in labels
    assert "steer_sweep" in charts(app)
    app.number_input(key="steer_alpha").set_value(0.0).run()
    assert float(app.metric[0].value) == 0.0  # α = 0 changes nothing


def test_ablation_compares_the_plane_with_random_planes(app):
    app.radio(key="intervention_tool").set_value("Ablation").run()
    app.number_input(key="ablate_random").set_value(4)
    app.button[0].click().run()
    assert_clean(app)
    assert [m.label for m in app.metric][1] == "Random planes"
    assert "ablate_hist" in charts(app)
