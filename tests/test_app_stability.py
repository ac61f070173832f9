"""AppTest of the Stability tab: a cost estimate first, then the five figures for the chosen token."""

from __future__ import annotations

from pathlib import Path

import pytest
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


class Stopped(Exception):
    """Stands in for Streamlit's StopException, raised at the next Streamlit call after Stop."""


class StoppableBar:
    """st.progress's bar as Stop sees it: each update raises once the stop flag is set."""

    def __init__(self, stop) -> None:
        self.stop, self.texts = stop, []

    def progress(self, value: float, text: str = "") -> None:
        self.texts.append(text)
        if self.stop.is_set():
            raise Stopped

    def empty(self) -> None:
        pass


PHASES = ["fixed point", "eigenvalues", "Lyapunov exponents", "attribution"]


@pytest.mark.parametrize("phase", PHASES)
def test_stop_ends_the_stability_action_in_every_phase(monkeypatch, phase):
    import threading
    import time
    import types

    import torch

    import workbench
    from apps import stability_compute
    from recurrent_model import RecurrentLM, preset

    torch.manual_seed(0)
    model = RecurrentLM(preset("tiny")).eval()
    for module in model.modules():  # slowed: every layer call sleeps
        module.register_forward_hook(lambda *_: time.sleep(0.002))
    ids = (1, 5, 9, 3)
    traj = workbench.collect(model, list(ids), 4, seeds=[0])
    run = types.SimpleNamespace(token_ids=ids, num_steps=4, seeds=(0,), init_scale=1.0)
    stop = threading.Event()
    bar = StoppableBar(stop)
    monkeypatch.setattr(stability_compute.st, "progress", lambda *a, **k: bar)
    monkeypatch.setattr(stability_compute, "BAR_INTERVAL", 0.0)  # every pass moves the bar
    raised: list[BaseException] = []

    def work() -> None:
        try:
            stability_compute.token_stability.__wrapped__(model, traj, run, 2, 4, "≈ 1 s")
        except Stopped as exc:
            raised.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while not any(phase in t for t in bar.texts) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert any(phase in t for t in bar.texts), bar.texts  # the phase reports its passes
    stop.set()  # Stop pressed
    pressed, updates = time.monotonic(), len(bar.texts)
    worker.join(timeout=10)
    assert not worker.is_alive() and raised, "the worker kept running after Stop"
    assert time.monotonic() - pressed < 3.0
    assert len(bar.texts) <= updates + 1, bar.texts  # it raised at the next update
