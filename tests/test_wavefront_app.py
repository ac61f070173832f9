"""AppTest of the app's Wavefront tab: diffusion sampling and the wavefront heatmap render."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")


def test_wavefront_tab_samples_and_draws_the_heatmap():
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(4)
    at.text_input(key="seeds").set_value("0")
    at.session_state["view"] = "Wavefront"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.info and "Press Sample" in at.info[0].value
    at.number_input(key="wf_new").set_value(5)
    at.number_input(key="wf_inner").set_value(2)
    at.number_input(key="wf_exit_t").set_value(0.5)  # freeze early: a few sampler steps suffice
    at.button[0].click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert "wavefront_heatmap" in {c.key for c in at.get("plotly_chart")}
    estimate = [c.value for c in at.caption if c.value.startswith("Diffusion sampling: ")]
    assert estimate and "about 7 sampler passes × 2 iterations" in estimate[0]  # 5 + 4 / 2


def test_a_heavy_sampling_waits_for_its_estimate_button(monkeypatch):
    from apps import cost

    monkeypatch.setattr(cost, "HEAVY_SECONDS", 0.0)  # every estimate counts as heavy
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(4)
    at.text_input(key="seeds").set_value("0")
    at.session_state["view"] = "Wavefront"
    at.run()
    at.number_input(key="wf_new").set_value(3)
    at.button[0].click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert "wavefront_heatmap" not in {c.key for c in at.get("plotly_chart")}
    at.button(key="wf_go").click().run()
    assert not at.exception and not at.error
    assert "wavefront_heatmap" in {c.key for c in at.get("plotly_chart")}
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["Sampler steps"]) >= 1
    assert at.get("download_button")[-1].proto.label == "Download wavefront.csv"
