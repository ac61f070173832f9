"""AppTest of the Stability tab: a cost estimate first, then the five figures for the chosen token."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from recurrent_model.standin import fallback_model

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
FIGURES = {"stab_eigen", "stab_running", "stab_distance", "stab_lyapunov", "stab_attribution"}


def test_stability_tab_estimates_then_shows_the_token_analysis():
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(16)
    at.text_input(key="seeds").set_value("0")
    at.text_area(key="prompt").set_value("def add(a, b):\n    return a + b")
    at.session_state["view"] = "Stability"
    at.run()
    assert not at.exception, at.exception
    assert any("at most" in m.value and "GFLOP" in m.value for m in at.markdown)
    assert not FIGURES & {
        c.key for c in at.get("plotly_chart")
    }  # nothing computed before the toggle
    at.number_input(key="stab_k").set_value(4)
    at.toggle(key="stab_go").set_value(True)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert FIGURES <= {c.key for c in at.get("plotly_chart")}
    assert any("λ_1 =" in m.value and " ± " in m.value for m in at.markdown)  # with its error
    at.run()  # the finished run calibrates the next estimate of the stability of a token
    assert any("at most" in m.value and "from the last run" in m.value for m in at.markdown)


def test_training_tab_shows_lambda_1_per_checkpoint_on_request(tmp_path):
    run = tmp_path / "run"
    for step, seed in ((10, 1), (20, 2)):
        fallback_model(seed=seed).save_pretrained(run / "checkpoints" / f"step-{step:07d}")
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(16)
    at.text_input(key="seeds").set_value("0, 1")
    at.text_area(key="prompt").set_value("def add(a, b):")
    at.session_state["view"] = "Training"
    at.run()
    at.text_input(key="series_dir").set_value(str(run))
    at.toggle(key="series_go").set_value(True)
    at.run()
    assert "series_stability_fig" not in {c.key for c in at.get("plotly_chart")}
    at.toggle(key="series_stability").set_value(True)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "series_stability_fig" in {c.key for c in at.get("plotly_chart")}


def test_a_jvps_cost_is_measured_once_per_model_and_prefix(monkeypatch):
    """The stability estimate counts a JVP at the cost measured on this model (forward-mode AD
    costs 3-8 plain calls on a CPU, depending on dtype, width and rows), not a constant."""
    from apps import stability_compute

    model = fallback_model(seed=3)
    calls: list[int] = []
    measure = stability_compute._measured_jvp_passes

    def counted(m, tokens):
        calls.append(tokens)
        return measure(m, tokens)

    monkeypatch.setattr(stability_compute, "_measured_jvp_passes", counted)
    ratio = stability_compute.jvp_passes(model, 5)
    assert ratio >= 1.0 and stability_compute.jvp_passes(model, 5) == ratio
    stability_compute.jvp_passes(model, 500)  # capped at JVP_PROBE_TOKENS
    stability_compute.jvp_passes(model, 1000)
    assert calls == [5, stability_compute.JVP_PROBE_TOKENS]
    cheap = stability_compute.estimate(model, 5, 8, 2).seconds
    monkeypatch.setitem(stability_compute._JVP_PASSES[model], 5, 10 * ratio)
    assert stability_compute.estimate(model, 5, 8, 2).seconds > 2 * cheap
