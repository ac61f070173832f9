"""AppTest of the Training tab: workbench.checkpoint_series over a run's checkpoints, from the app."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from recurrent_model.standin import fallback_model

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")


def test_training_tab_analyses_every_checkpoint_of_a_run(tmp_path):
    run = tmp_path / "run"
    for step, seed in ((10, 1), (20, 2)):
        fallback_model(seed=seed).save_pretrained(run / "checkpoints" / f"step-{step:07d}")
    at = AppTest.from_file(APP, default_timeout=240).run()
    at.number_input(key="steps").set_value(16)
    at.text_input(key="seeds").set_value("0, 1")
    at.text_area(key="prompt").set_value("def add(a, b):\n    return a + b")
    at.session_state["view"] = "Training"
    at.run()
    at.text_input(key="series_dir").set_value(str(tmp_path / "empty"))
    at.run()
    assert not at.exception
    assert any("does not exist" in e.value for e in at.error)  # a message, not a traceback

    at.text_input(key="series_dir").set_value(str(run))
    at.run()
    assert any("steps 10, 20" in m.value for m in at.markdown)
    estimate = [c.value for c in at.caption if c.value.startswith("2 checkpoints × ")]
    assert estimate and "depths" in estimate[0] and "2 seeds at 16 steps" in estimate[0]
    assert " s " in estimate[0]  # the seconds, before the toggle starts anything
    assert not {c.key for c in at.get("plotly_chart")} & {"series_fig", "series_depth"}
    at.toggle(key="series_go").set_value(True)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert {"series_fig", "series_depth"} <= {c.key for c in at.get("plotly_chart")}
    table = at.dataframe[0].value
    assert sorted(table["step"].unique()) == [10, 20] and (table["loss"] > 0).all()


def test_the_series_estimate_counts_checkpoints_depths_and_seeds():
    from apps import cost

    config = fallback_model(seed=0).config
    t, depths = 9, (1, 2, 4)
    per_text = sum(cost.forward_flops(config, t, d) for d in depths)
    per_text += cost.forward_flops(config, t, 16, 2)  # the collection of two seeds at 16 steps
    assert cost.checkpoint_series_flops(config, t, depths, 16, 2, 1) == per_text
    assert cost.checkpoint_series_flops(config, t, depths, 16, 2, 3, texts=2) == 6 * per_text
