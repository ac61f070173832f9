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
    assert shown["clean answer"] == "'7'" and shown["corrupted answer"] == "'5'"
    assert float(shown["gap (logit difference)"].split()[0]) >= 1.0


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


def captions(at: AppTest) -> list[str]:
    return [c.value for c in at.caption]


def plan_caption(at: AppTest, prefix: str) -> str:
    shown = [c for c in captions(at) if c.startswith(prefix)]
    assert len(shown) == 1, captions(at)
    return shown[0]


def batch_in(caption: str) -> int:
    """The batch size an estimate caption names ("…, 7 per batch: ≈ …")."""
    return int(caption.split(" per batch")[0].rsplit(" ", 1)[1])


def recording(monkeypatch, name: str) -> list[dict]:
    """Wrap workbench.<name> so that every call's keywords are kept (the call still runs)."""
    import workbench

    calls, original = [], getattr(workbench, name)

    def wrapper(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(workbench, name, wrapper)
    return calls


def test_heavy_patching_shows_its_estimate_and_waits_then_uses_the_plans_batch(app, monkeypatch):
    from apps import cost

    monkeypatch.setattr(cost, "HEAVY_SECONDS", 0.0)  # every estimate counts as heavy
    calls = recording(monkeypatch, "patch_states")
    app.radio(key="intervention_tool").set_value("Patching").run()
    app.radio(key="patch_pair").set_value("Default pair")
    app.radio(key="patch_direction").set_value("noising")  # not cached by the tests above
    app.button[0].click().run()
    assert_clean(app)
    shown = plan_caption(app, "Patching: ")
    assert "patches × up to 12 steps" in shown and " s " in shown
    assert not calls and "patch_heatmap" not in charts(app)  # the estimate came first
    app.button(key="patch_go").click().run()
    assert_clean(app)
    assert [c["batch_size"] for c in calls] == [batch_in(shown)]
    assert "patch_heatmap" in charts(app)


def test_ablation_defaults_scale_and_its_bar_follows_the_plans_batches(app, monkeypatch):
    from apps import intervention_compute

    calls = recording(monkeypatch, "ablate_subspace")
    app.radio(key="intervention_tool").set_value("Ablation").run()
    assert app.number_input(key="ablate_random").value in intervention_compute.RANDOM_PLANE_CHOICES
    app.number_input(key="ablate_random").set_value(3)  # not cached by the test above
    app.button[0].click().run()
    assert_clean(app)
    shown = plan_caption(app, "Ablation: ")
    assert "3 random planes × 12 steps" in shown
    assert [c["batch_size"] for c in calls] == [batch_in(shown)]
    bar = calls[0]["progress"]
    assert bar.updates >= 1 and bar.elapsed is not None  # drawn while it ran, then emptied


def test_heavy_steering_waits_for_its_button(app, monkeypatch):
    from apps import cost

    monkeypatch.setattr(cost, "HEAVY_SECONDS", 0.0)
    app.radio(key="intervention_tool").set_value("Steering").run()
    app.number_input(key="steer_alpha").set_value(0.5).run()
    assert_clean(app)
    assert "14 forwards × 12 steps" in plan_caption(app, "Steering: ")
    assert "KL(baseline ‖ steered)" not in [m.label for m in app.metric]
    app.button(key="steer_go").click().run()
    assert_clean(app)
    assert "KL(baseline ‖ steered)" in [m.label for m in app.metric]
