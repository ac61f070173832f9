"""AppTest of the Compare and Bundle tabs: two tiny checkpoints (Huginn in the sidebar, a
retrofitted model beside it) drawn side by side, a second model that would not fit refused in one
line, a bundle written and opened again showing the same frames, and a bad upload in one line."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import tiny_family_model
from streamlit.testing.v1 import AppTest

import workbench.bundle
from apps import compare_compute, tab_bundle
from recurrent_model.standin import byte_level_tokenizer, fallback_model

APP = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
STEPS = 8
PROMPT = "A 3 egg omelet."


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def chart_keys(at: AppTest) -> set[str]:
    return {c.key for c in at.get("plotly_chart")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny Huginn (the stand-in's layout), a tiny retrofitted model and a tiny Ouro, one byte
    tokenizer."""
    root = tmp_path_factory.mktemp("two")
    first = fallback_model(seed=1)
    first.config.name = "tiny-huginn"
    first.save_pretrained(root / "huginn")
    for family in ("retrofit", "ouro"):
        other = tiny_family_model(family)
        other.tokenizer = byte_level_tokenizer(other.config.vocab_size)
        other.save_pretrained(root / family)
    return root / "huginn", root / "retrofit", root / "ouro"


@pytest.fixture(scope="module")
def app(checkpoints) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    at.session_state["prompt"] = PROMPT
    at.run()
    at.text_input(key="checkpoint").set_value(str(checkpoints[0])).run()
    at.number_input(key="steps").set_value(STEPS)
    at.text_input(key="seeds").set_value("0").run()
    at.session_state["view"] = "Compare"
    return at.run()


def test_without_a_second_checkpoint_the_tab_says_what_to_enter(app):
    assert_clean(app)
    assert any("Enter a second checkpoint" in i.value for i in app.info)


def test_two_checkpoints_are_drawn_side_by_side(app, checkpoints):
    app.text_input(key="cmp_checkpoint").set_value(str(checkpoints[1])).run()
    assert_clean(app)
    assert {"cmp_convergence", "cmp_kinds", "cmp_pca"} <= chart_keys(app)
    memory = next(c.value for c in app.caption if c.value.startswith("Memory for two models"))
    assert "the first's weights" in memory and "free on cpu" in memory
    pca = next(c for c in app.get("plotly_chart") if c.key == "cmp_pca")
    assert "one PCA" in pca.proto.spec  # fitted on both: the hidden sizes agree (64)
    assert not any("tokenizers disagree" in c.value for c in app.caption)  # one byte tokenizer
    comparison = app.session_state["compare_last"]
    kinds = comparison.frames["compare_kinds"]
    assert list(kinds.columns) == ["position", "token", "kind_a", "kind_b"]  # aligned: one row each
    assert comparison.settings["second_family"] == "Retrofitted"
    assert comparison.settings["second_num_steps"] == STEPS


def test_an_ouro_checkpoint_runs_once_from_its_embedding_beside_huginn(app, checkpoints):
    app.text_input(key="cmp_checkpoint").set_value(str(checkpoints[2])).run()
    assert_clean(app)
    assert {"cmp_convergence", "cmp_kinds", "cmp_pca"} <= chart_keys(app)
    comparison = app.session_state["compare_last"]
    assert comparison.settings["second_family"] == "Ouro"
    assert comparison.settings["second_seeds"] == [0]


def test_a_second_model_that_would_not_fit_is_refused_in_one_line(app, checkpoints, monkeypatch):
    monkeypatch.setattr(compare_compute, "available_memory", lambda device: 1000)
    app.text_input(key="cmp_checkpoint").set_value(str(checkpoints[1]) + "/").run()
    assert not app.exception
    refusal = [e.value for e in app.error]
    assert len(refusal) == 1 and "does not fit" in refusal[0] and "\n" not in refusal[0]
    assert "cmp_convergence" not in chart_keys(app)


def test_on_a_gpu_the_weights_count_against_its_memory_and_the_trajectory_against_the_hosts():
    plan = lambda free, host: compare_compute.MemoryPlan(  # noqa: E731
        first=100, second=500, trajectory=300, free=free, host_free=host, device="cuda:0",
        second_loaded=False,
    )  # fmt: skip
    assert plan(free=1000, host=1000).fits
    assert "its weights need" in plan(free=600, host=10**6).refusal()
    assert "of host memory" in plan(free=10**6, host=350).refusal()
    cpu = compare_compute.MemoryPlan(100, 500, 300, 900, 10**6, "cpu", second_loaded=False)
    assert "weights and trajectory need" in cpu.refusal()  # 800 > 0.8 × 900: one budget
    loaded = compare_compute.MemoryPlan(100, 500, 300, 1000, 1000, "cpu", second_loaded=True)
    assert loaded.fits  # a model in memory already takes nothing more


def test_a_bundle_written_and_opened_again_shows_the_same_frames(app, checkpoints, tmp_path):
    app.text_input(key="cmp_checkpoint").set_value(str(checkpoints[1])).run()
    app.session_state["view"] = "Bundle"
    app.run()
    next(b for b in app.button if b.key == "bundle_write").click().run()
    assert_clean(app)
    name, data, _ = app.session_state[tab_bundle.BUNDLE_FILE]
    assert any(b.key == "bundle_download" for b in app.get("download_button"))
    app.file_uploader(key="bundle_upload").set_value((name, data, "application/zip")).run()
    assert_clean(app)
    (tmp_path / name).write_bytes(data)
    opened = workbench.bundle.open(tmp_path / name)
    assert {"tokens", "convergence", "dynamics", "compare_kinds", "compare_pca"} <= set(
        opened.frames
    )
    # each frame is drawn under its name, in the bundle's order, after the settings table
    names = [m.value.split("**")[1] for m in app.main.markdown if m.value.startswith("**")]
    shown = dict(zip(names, [d.value for d in app.main.dataframe][-len(names) :]))
    assert set(shown) == set(opened.frames)
    for frame_name, frame in opened.frames.items():
        pd.testing.assert_frame_equal(
            shown[frame_name].reset_index(drop=True), frame.reset_index(drop=True),
            check_dtype=False,
        )  # fmt: skip
    assert {f"bundle_figure_{n}" for n in opened.figures} <= chart_keys(app)
    assert opened.settings["num_steps"] == STEPS and opened.settings["prompt"] == PROMPT


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a zip at all", "not a readable zip"),
        ("newer", "newer than this workbench reads"),
    ],
)
def test_a_bad_upload_is_one_line(app, content, message):
    if content == "newer":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("bundle.json", '{"format": "workbench-bundle", "format_version": 99}')
        content = buffer.getvalue()
    app.session_state["view"] = "Bundle"
    app.run()
    app.file_uploader(key="bundle_upload").set_value(("bad.zip", content, "application/zip")).run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0]
    assert errors[0].startswith("bad.zip:")


def test_tokenizers_that_disagree_get_a_one_line_note(app):
    from recurrent_model.standin import DEFAULT_CHECKPOINT

    if not (DEFAULT_CHECKPOINT / "model.safetensors").is_file():
        pytest.skip("checkpoints/default is not present")
    app.session_state["view"] = "Compare"
    app.run()
    app.text_input(key="cmp_checkpoint").set_value(str(DEFAULT_CHECKPOINT)).run()
    assert_clean(app)
    notes = [c.value for c in app.caption if "tokenizers disagree" in c.value]
    assert len(notes) == 1 and "none are aligned" in notes[0]
    assert {"cmp_convergence", "cmp_kinds", "cmp_pca"} <= chart_keys(app)
    pca = next(c for c in app.get("plotly_chart") if c.key == "cmp_pca")
    assert "its own PCA" in pca.proto.spec  # hidden sizes 64 and 192: no common space
    kinds = app.session_state["compare_last"].frames["compare_kinds"]
    assert list(kinds.columns) == ["model", "position", "token", "kind"]


def test_the_pair_figures_share_scales_and_say_when_tokens_are_not_aligned():
    import numpy as np

    from workbench import figures

    def conv(n_tokens: int, steps: int, scale: float) -> pd.DataFrame:
        grid = [(p, s) for p in range(n_tokens) for s in range(steps + 1)]
        return pd.DataFrame({
            "position": [p for p, _ in grid], "step": [s for _, s in grid],
            "token": [f"t{p}" for p, _ in grid],
            "distance_to_final": [scale * (steps - s + 1) for _, s in grid],
        })  # fmt: skip

    names = ("A: a", "B: b")
    fig = figures.convergence_pair(conv(3, 4, 1.0), conv(3, 8, 100.0), names)
    a, b = fig.data
    assert a.zmin == b.zmin and a.zmax == b.zmax  # one colour scale over both
    assert a.zmax == pytest.approx(np.log10(900.0)) and a.zmin == pytest.approx(0.0)
    assert "each panel has its own tokens" not in fig.layout.title.text
    unaligned = figures.convergence_pair(conv(3, 4, 1.0), conv(5, 4, 1.0), names, aligned=False)
    assert "each panel has its own tokens" in unaligned.layout.title.text
    kinds = figures.kinds_pair(["orbit", "fixed_point"], ["slider", "other"], ["x", "y"],
                               ["x", "y"], names)  # fmt: skip
    assert kinds.data[0].z.tolist() == [[2.0, 0.0]] and kinds.data[1].z.tolist() == [[3.0, 4.0]]
    with pytest.raises(ValueError, match="unknown dynamics kinds"):
        figures.kinds_pair(["spiral"], ["orbit"], ["x"], ["x"], names)
    coords_a, coords_b = np.zeros((5, 2, 2)), np.ones((9, 3, 2))
    pca = figures.joint_pca_pair(coords_a, coords_b, ["x", "y"], ["x", "y", "z"], names, [0.5, 0.2])
    paths = [t for t in pca.data if t.mode != "text"]
    assert {(t.marker.cmin, t.marker.cmax) for t in paths} == {(0, 8)}  # one step colour scale
    assert pca.layout.xaxis2.matches == "x" and "one PCA" in pca.layout.title.text
    own = figures.joint_pca_pair(
        coords_a, coords_b, ["x", "y"], ["x", "y", "z"], names, joint=False
    )
    assert own.layout.xaxis2.matches is None and "its own PCA" in own.layout.title.text
