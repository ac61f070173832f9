"""The app's helpers: the labelled random stand-in model and the checks on sidebar input."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

from apps import inputs
from recurrent_model import load_model
from recurrent_model.standin import (
    DEFAULT_CHECKPOINT,
    FALLBACK_CONTEXT,
    byte_level_tokenizer,
    fallback_model,
    is_fallback,
)
from recurrent_model.tokenizer import SPECIAL_TOKENS


def test_byte_level_tokenizer_puts_the_specials_at_v_minus_32():
    tok = byte_level_tokenizer(512)
    assert tok.vocab_size == 512
    assert [tok.backend.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(480, 490))
    text = "Claire makes a 3 egg omelet — ünïcode ✓"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id and all(i < 256 for i in ids[1:])
    assert len(ids) == 1 + len(text.encode())  # one token per byte: no merges
    assert tok.decode(ids[1:]) == text
    chat = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert chat[:2] == [tok.bos_id, tok.begin_header_id]


def test_fallback_model_is_labelled_seeded_and_a_valid_checkpoint(tmp_path):
    a, b = fallback_model(), fallback_model()
    assert is_fallback(a) and a.config.block_size == FALLBACK_CONTEXT
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.transformer.wte.weight, fallback_model(seed=1).transformer.wte.weight)
    a.save_pretrained(tmp_path / "ckpt")
    loaded = load_model(tmp_path / "ckpt")
    assert is_fallback(loaded)
    ids = torch.tensor([a.tokenizer.encode("3 eggs")])
    assert torch.allclose(
        a(ids, num_steps=3, init_scale=0).logits, loaded(ids, num_steps=3, init_scale=0).logits
    )
    assert loaded.tokenizer.encode("3 eggs") == a.tokenizer.encode("3 eggs")


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("0", (0,)), ("0, 1,2", (0, 1, 2)), (" 7  3 ", (7, 3)), ("0,\n5", (0, 5))],
)
def test_parse_seeds(text, seeds):
    assert inputs.parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "1.5", "-1", "1, 1", "0 1 2 3 4 5 6 7 8", "2147483648"])
def test_bad_seeds_raise_input_error(text):
    with pytest.raises(inputs.InputError):
        inputs.parse_seeds(text)


def test_steps_and_init_scale_ranges():
    assert inputs.check_steps(1) == 1 and inputs.check_steps(256.0) == 256
    for bad in (0, -3, 257, 2.5, None):
        with pytest.raises(inputs.InputError, match="Steps must be"):
            inputs.check_steps(bad)
    assert inputs.check_init_scale(0) == 0.0 and inputs.check_init_scale(10) == 10.0
    for bad in (-0.1, 10.5, None):
        with pytest.raises(inputs.InputError, match="Init scale"):
            inputs.check_init_scale(bad)


def test_encode_input_prompt_chat_and_errors():
    tok = byte_level_tokenizer()
    assert inputs.encode_input(tok, 64, "hi") == (tok.bos_id, *tok.encode("hi", add_bos=False))
    chat = inputs.encode_input(tok, 64, "hi", system="be brief", chat=True)
    assert chat == tuple(
        tok.encode_chat(
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        )
    )
    with pytest.raises(inputs.InputError, match="empty"):
        inputs.encode_input(tok, 64, " \n ")
    with pytest.raises(inputs.InputError, match="8 tokens long but the model's context holds 7"):
        inputs.encode_input(tok, 7, "1234567")
    with pytest.raises(inputs.InputError, match="no tokenizer.json"):
        inputs.encode_input(None, 64, "hi")


def test_resolve_checkpoint(tmp_path):
    assert inputs.resolve_checkpoint(str(tmp_path)) == tmp_path.resolve()
    assert inputs.resolve_checkpoint("checkpoints/default") == DEFAULT_CHECKPOINT.resolve()
    assert inputs.resolve_checkpoint(f"{tmp_path}/x/../y") == tmp_path.resolve() / "y"
    with pytest.raises(inputs.InputError):
        inputs.resolve_checkpoint("  ")


def test_small_models_run_single_threaded_and_the_setting_is_restored(monkeypatch):
    from recurrent_model import threads as runtime

    model = fallback_model()
    before = torch.get_num_threads()
    with runtime.threads_for(model):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setattr(runtime, "SINGLE_THREAD_PARAMS", model.num_parameters())
    with runtime.threads_for(model):  # at the size limit: torch's default is kept
        assert torch.get_num_threads() == before


def test_downloads_round_trip(tmp_path):
    import numpy as np
    import pandas as pd

    import workbench
    from apps import compute
    from apps.cached import with_key

    model = fallback_model()
    traj = workbench.collect(model, model.tokenizer.encode("3 eggs"), 4, seeds=(0, 1))
    path = tmp_path / "trajectory.safetensors"
    path.write_bytes(compute.trajectory_file(with_key(traj, ("test-key", str(tmp_path)))))
    loaded = workbench.Trajectory.load(path)
    assert np.array_equal(loaded.raw_states, traj.raw_states) and loaded.tokens == traj.tokens
    frame = workbench.convergence(traj.states[0], tokens=traj.tokens)
    (tmp_path / "c.csv").write_bytes(compute.csv_bytes(frame))
    back = pd.read_csv(tmp_path / "c.csv", keep_default_na=False, na_values=[""])
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    assert np.allclose(back["distance_to_final"], frame["distance_to_final"])


def test_resolve_checkpoint_accepts_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert inputs.resolve_checkpoint("org/name") == Path("org/name")  # load_model fetches it
    typo = inputs.resolve_checkpoint("checkpoints/no-such-run")  # a local folder: stays local
    assert typo.is_absolute() and typo.parent == DEFAULT_CHECKPOINT.parent.resolve()


def _linear_weights(model: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_forward_flops_count_every_matmul():
    """Known answer from the model's own nn.Linear weights (tiny preset), plus attention."""
    from apps import cost
    from recurrent_model import RecurrentLM, preset

    config = preset("tiny")
    model = RecurrentLM(config)
    t, r, runs = 10, 3, 2
    parts = {p: _linear_weights(getattr(model.transformer, p)) for p in ("prelude", "coda")}
    core, adapter = _linear_weights(model.transformer.core_block), config.n_embd * 2 * config.n_embd
    head = model.lm_head.weight.numel()
    matmul = 2 * t * (parts["prelude"] + parts["coda"] + head + r * (core + adapter))
    n_layers = config.n_layers_in_prelude + config.n_layers_in_coda
    attention = (
        2 * (n_layers + r * config.n_layers_in_recurrent_block) * t * (t + 1) * config.n_embd
    )
    assert cost.forward_flops(config, t, r, runs) == runs * (matmul + attention)
    # the published shape (3.56 B parameters): 46 tokens x 8 steps
    big = cost.forward_flops(preset("huginn-0125"), 46, 8, 1)
    assert big == pytest.approx(1.383e12, rel=1e-3)
    with pytest.raises(ValueError, match="must be >= 1"):
        cost.forward_flops(config, 0, 8)


def test_estimate_and_default_run_scaling():
    from apps import cost
    from recurrent_model.speed import Speed

    config = _tiny_config()
    flops = cost.forward_flops(config, 20, 8, 2)
    est = cost.estimate(flops, Speed.assumed(1e9), calls=10, call_seconds=0.01, overhead=2.0)
    assert est.seconds == pytest.approx(2.0 * flops / 1e9 + 0.1)
    assert "GFLOP/s" in est.describe() and "1 GFLOP/s" in est.describe()
    slow = cost.estimate(flops, Speed.assumed(2.5e8), calibration=3.0)
    assert "0.25 GFLOP/s" in slow.describe() and "× 3.00 from the last run" in slow.describe()
    assert slow.uncalibrated_seconds == pytest.approx(slow.seconds / 3)
    for per_unit, expected in [(0.1, (32, 5)), (0.2, (32, 3)), (1.0, (16, 1)), (10.0, (4, 1))]:
        assert cost.default_run(lambda s, n, c=per_unit: c * s * n) == expected, per_unit
    with pytest.raises(ValueError, match="flops_per_second"):
        cost.estimate(flops, Speed.assumed(0.0))
    assert cost.default_overhead("cpu", "bfloat16") == cost.HALF_CPU_OVERHEAD
    assert cost.default_overhead("cpu", "float32") == cost.OVERHEAD
    assert cost.default_overhead("cuda:0", "bfloat16") == cost.OVERHEAD


def test_heavy_action_costs_count_their_forwards():
    from apps import cost

    config = _tiny_config()
    t, r = 12, 6
    assert cost.patching_flops(config, t, r, 40) == cost.forward_flops(config, t, r, 42)
    assert cost.ablation_flops(config, t, r, 32) == cost.forward_flops(config, t, r, 35)
    head = config.vocab_size * config.n_embd
    assert cost.lens_flops(config, t, r, "logit") == (r + 1) * 2 * t * head
    assert cost.lens_flops(config, t, r, "coda") > cost.lens_flops(config, t, r, "logit")
    prompt = cost.forward_flops(config, t, r)
    one, two = (cost.generation_flops(config, t, n, r) - prompt for n in (1, 2))
    assert prompt < cost.generation_flops(config, t, 1, r)
    assert two > 2 * one  # the second token attends to one more key
    with pytest.raises(ValueError, match="kind"):
        cost.lens_flops(config, t, r, "tuned")
    assert cost.largest_within((24, 16, 8), lambda n: n, budget=16) == 16
    assert cost.largest_within((24, 16, 8), lambda n: n, budget=1) == 8


def test_a_heavy_lens_waits_for_its_button_with_the_estimate(monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from apps import cost

    monkeypatch.setattr(cost, "HEAVY_SECONDS", 0.0)  # every action counts as heavy
    st.cache_data.clear()
    app = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
    at = AppTest.from_file(app, default_timeout=240)
    at.session_state["view"] = "Lenses"
    at.session_state["steps"], at.session_state["seeds"] = 6, "0"
    at.run()
    assert not at.exception, at.exception
    assert not at.get("plotly_chart")  # the collection is heavy too: it waits for its button
    assert any("Collecting" in c.value and "GFLOP/s" in c.value for c in at.main.caption)
    at.button(key="collect_go").click().run()
    assert any("states through the coda lens" in c.value and "GFLOP" in c.value
               for c in at.main.caption)  # fmt: skip
    assert not at.get("plotly_chart")
    at.button(key="lens_go").click().run()
    assert not at.exception and not at.error
    assert "lens_heatmap" in {c.key for c in at.get("plotly_chart")}
    at.selectbox(key="lens_value").set_value("entropy").run()  # approved: no second ask
    assert "lens_heatmap" in {c.key for c in at.get("plotly_chart")}


def test_batches_stay_short_so_stop_acts_within_seconds(monkeypatch):
    from apps import cost, intervention_compute
    from recurrent_model import preset

    assert cost.batch_size_for(0.5, most=64, target=3.0) == 6
    assert cost.batch_size_for(10.0, most=64) == 1
    assert cost.batch_size_for(1e-6, most=64) == 64
    huge = types.SimpleNamespace(
        config=preset("huginn-0125"),
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        num_parameters=lambda: 3_560_000_000,
    )
    from apps import compute
    from recurrent_model.speed import Speed

    monkeypatch.setattr(compute, "measured_speed", lambda *a, **k: Speed.assumed(1e11))  # fast
    guess, batch = intervention_compute.patching_plan(huge, 38, 24, 950)
    assert guess.seconds > 3600 and batch == 1  # hours: one patch per batch
    assert intervention_compute.default_random_planes(huge, 38, 24) == 2


def _tiny_config():
    from recurrent_model import preset

    return preset("tiny")


def test_a_finished_action_calibrates_its_next_estimate():
    from apps import compute
    from recurrent_model import RecurrentLM, preset

    model = RecurrentLM(preset("tiny")).eval()
    first = compute.estimate(model, 12, 8, 2)
    assert first.calibration == 1.0 and first.speed is not None and first.calls > 0
    first.done(3.0 * first.seconds)  # the run took three times the estimate
    second = compute.estimate(model, 12, 8, 2)
    assert second.calibration == pytest.approx(3.0, rel=0.5)  # the probe may be re-measured
    assert second.seconds > first.seconds and "from the last run" in second.describe()
    assert compute.estimate_flops(model, 1e9, rows=4).calibration == 1.0  # another action


def test_collect_progress_reports_every_update_in_order():
    from apps import compute, cost

    finished = []
    guess = cost.CostEstimate(flops=1e9, flops_per_second=1e9, seconds=1.0, on_done=finished.append)
    progress = compute.CollectProgress("1 run(s)", guess, min_interval=0.0)
    progress.start()
    for done in range(5):
        progress(done, 4)
    progress.finish()
    assert progress.updates == 5 and progress.elapsed is not None
    assert finished == [progress.elapsed]  # the run's time calibrates the next estimate
    assert progress.text(0, 4, 0.5) == (
        "Collecting 1 run(s): 0/4 run-iterations · 0 s of an estimated 1 s at the start"
    )
    assert progress.text(1, 4, 3.0) == (  # from the first part on, its own pace
        "Collecting 1 run(s): 1/4 run-iterations · 3 s, about 9 s left (estimated 1 s at the start)"
    )


def test_app_scales_defaults_to_the_device_and_shows_the_estimate(monkeypatch):
    """On a slow device (a stand-in probe speed) the app opens with fewer seeds and steps, chosen
    by cost.default_run, and shows the estimate; on a fast one it keeps 32 steps x 5 seeds."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from apps import compute
    from recurrent_model.speed import Speed

    app = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
    for speed in (1e13, 2e8):
        st.cache_data.clear()
        fixed = Speed.assumed(speed)
        monkeypatch.setattr(compute, "measured_speed", lambda *a, s=fixed, **k: s)
        at = AppTest.from_file(app, default_timeout=240).run()
        assert not at.exception, at.exception
        heavy = [b for b in at.button if b.key == "collect_go"]
        if heavy:  # a heavy first collection waits for its button
            heavy[0].click().run()
            assert not at.exception, at.exception
        steps, seeds = at.session_state["steps"], at.session_state["seeds"]
        text = [m.value for m in at.sidebar.markdown if m.value.startswith("Estimated collection")]
        assert len(text) == 1 and "GFLOP/s" in text[0]
        shown = [c.value for c in at.sidebar.caption if c.value.startswith("Speed: ")]
        assert len(shown) == 1 and "F.linear" in shown[0] and "at load" in shown[0]
        if speed > 1e12:
            assert (steps, seeds) == (32, "0, 1, 2, 3, 4")
        else:
            assert (steps, len(seeds.split(","))) < (32, 5)
            assert any(f"{steps} steps" in c.value for c in at.caption)
    st.cache_data.clear()


class _FakeAlignedUMAP:
    """Stands in for umap.AlignedUMAP (a real fit takes minutes here): first two PCs."""

    def __init__(self, n_components=2, **kwargs):
        self.n_components = n_components

    def fit(self, slices, relations):
        self.embeddings_ = [s[:, : self.n_components] for s in slices]
        return self


def test_path_independence_tab_shows_aligned_umap_across_seeds(monkeypatch):
    import sys
    import types

    from streamlit.testing.v1 import AppTest

    from apps import umap_worker
    from workbench import figures, projections

    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(AlignedUMAP=_FakeAlignedUMAP))
    # the fake is in this process: the fit runs here, not in the UMAP process
    monkeypatch.setattr(
        umap_worker.WORKER, "fit", lambda request, tick: umap_worker._answer(request)
    )
    projections.umap_cache_clear()
    app = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
    at = AppTest.from_file(app, default_timeout=240).run()
    at.number_input(key="steps").set_value(6)
    at.text_input(key="seeds").set_value("0, 1, 2")
    at.session_state["view"] = "Path independence"
    at.run()
    at.toggle(key="pi_aligned").set_value(True).run()
    assert not at.exception, at.exception
    charts = [c for c in at.get("plotly_chart") if c.key == "aligned_umap"]
    assert len(charts) == 1
    projections.umap_cache_clear()
    fig = figures.aligned_embeddings_figure([np.zeros((7, 2)), np.ones((7, 2))], ["a", "b"])
    assert len(fig.data) == 4 and list(fig.data[2].x) == [1.0] * 7
    with pytest.raises(ValueError, match="names"):
        figures.aligned_embeddings_figure([np.zeros((7, 2))], ["a", "b"])


def test_patching_is_estimated_on_the_cells_it_runs():
    import workbench
    from apps.intervention_compute import patches_to_run
    from recurrent_model import RecurrentLM, preset

    model = RecurrentLM(preset("tiny")).eval()
    clean, corrupted, steps = (5, 6, 7, 8, 9), (5, 6, 11, 8, 9), 4
    for positions in ("each", "all"):
        totals = []
        workbench.patch_states(
            model, list(clean), list(corrupted), steps, positions=positions, target=3,
            progress=lambda done, total, seen=totals: seen.append(total),
        )  # fmt: skip
        assert totals[-1] == patches_to_run(clean, corrupted, steps, positions), positions
