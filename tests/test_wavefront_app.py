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

    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(4)
    at.text_input(key="seeds").set_value("0")
    at.session_state["view"] = "Wavefront"
    at.run()
    monkeypatch.setattr(cost, "HEAVY_SECONDS", 0.0)  # every estimate from here on is heavy
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


def test_diffusion_cost_counts_the_prefill_and_the_sampler_passes():
    from apps import cost
    from recurrent_model.standin import fallback_model

    config = fallback_model(seed=0).config
    t, r = 10, 8
    assert cost.diffusion_passes(5, r, 2, 1) == 5 + 4  # one per new token, then 8 / 2 to finish
    assert cost.diffusion_passes(5, r, 3, 2) == 3 + 3  # ceilings of 5 / 2 and 8 / 3
    assert cost.diffusion_wave(24, r, 2, 1) == 4 and cost.diffusion_wave(2, r, 2, 1) == 2
    assert cost.diffusion_wave(500, 64, 1, 4, max_wavefront=128) == 128
    prefill = cost.forward_flops(config, t, r)
    one, two = (cost.diffusion_flops(config, t, n, r, 2, 1) - prefill for n in (8, 16))
    assert 0 < one < two  # more new tokens: more passes over a longer context
    assert cost.diffusion_flops(config, t, 8, r, 8, 1) < prefill + one  # fewer, wider passes
