"""Stop ends every heavy action of the app within seconds, and a finished one calibrates the next.

Each action runs as a Streamlit script (AppTest's script runner, in its own thread) on a tiny model
slowed by hooks; once its bar moves, Stop is pressed the way the browser's Stop button does it
(``ScriptRunner.request_stop``) and the script thread must end within ``BOUND_S``. Streamlit ends
a run only at a Streamlit call, so this checks that every phase reaches one often.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
import stop_driver
import torch
from streamlit.testing.v1 import AppTest

import workbench
from apps import compute, cost, intervention_compute, stability_compute, umap_worker
from apps.cached import with_key
from apps.inputs import RunSettings
from recurrent_model.hook_names import STATE
from recurrent_model.standin import fallback_model
from workbench.lyapunov import lyapunov_run

BOUND_S = 3.0
SLEEP_S = 0.002  # per hook firing and module call: a tiny model at a large model's pace
IDS = (1, 40, 50, 60, 70, 80, 90, 100)


def guess(seconds: float = 1.0) -> cost.CostEstimate:
    return cost.CostEstimate(flops=1e9, flops_per_second=1e9 / seconds, seconds=seconds)


def slowed(model):
    """Every hook point and module call of ``model`` sleeps SLEEP_S (hooks stay attached)."""
    model.hooks([(lambda name: True, lambda x, hook: time.sleep(SLEEP_S))]).__enter__()
    for module in model.modules():
        module.register_forward_hook(lambda *_: time.sleep(SLEEP_S))
    return model


@pytest.fixture(scope="module")
def prepared():
    """A keyed tiny model and a keyed trajectory of it (collected before the model is slowed)."""
    model = with_key(fallback_model(seed=5), f"stop-test|{uuid.uuid4()}")
    run = RunSettings(token_ids=IDS, num_steps=12, seeds=(0, 1), init_scale=1.0)
    traj = workbench.collect(model, list(IDS), 12, seeds=[0, 1], init_scale=1.0)
    traj = with_key(traj, (model.cache_key, run))
    # torch.func's first JVP in a process loads its machinery for seconds, once per server:
    # done here, so that the stability phases are timed on their own passes
    state = torch.from_numpy(np.ascontiguousarray(traj.raw_states[0][0]))
    lyapunov_run(model, list(IDS), 2, position=3, k=1, state=state)
    return slowed(model), run, traj


def run_then_stop(task: Callable[[], None], running: Callable[[], bool]) -> float:
    """Run ``task`` as a script; once ``running()``, press Stop; the seconds the script thread
    took to end (it must not have finished on its own)."""
    stopped = stop_driver.run_then_stop(task, running)
    assert stopped.error is None, f"the action failed: {stopped.error!r}"
    assert stopped.started, "the action did not start, or ended before Stop"
    assert stopped.ended, "the action kept running after Stop"
    assert not stopped.finished, "the action ran to its end instead of stopping"
    assert stopped.took < BOUND_S, f"Stop took {stopped.took:.1f} s"
    return stopped.took


def bar(what: str = "test", unit: str = "units") -> compute.TaskProgress:
    return compute.TaskProgress(what, unit, guess())


def moving(progress: compute.TaskProgress) -> Callable[[], bool]:
    return lambda: progress.updates > 0


def test_collection_stops(monkeypatch, prepared):
    model, _, _ = prepared
    run = RunSettings(token_ids=IDS, num_steps=200, seeds=tuple(range(16)), init_scale=1.0)
    progress = compute.CollectProgress("16 runs", guess())
    task = lambda: compute.trajectory(model, run, _progress=progress)  # noqa: E731
    run_then_stop(task, moving(progress))


@pytest.mark.parametrize("kind", ["coda", "logit"])
def test_lens_stops(monkeypatch, prepared, kind):
    model, run, traj = prepared
    progress = bar()
    tokens = [str(i) for i in IDS]
    monkeypatch.setattr(workbench.lenses, "lens_logits", _slow(workbench.lenses.lens_logits))
    task = lambda: compute.lens(model, traj, tokens, kind, _progress=progress)  # noqa: E731
    run_then_stop(task, moving(progress))


def _slow(fn):
    """``fn`` taking a second per call: the lens's chunks at a large model's pace."""

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return fn(*args, **kwargs)

    return slow


def test_generation_stops(monkeypatch, prepared):
    model, _, _ = prepared
    progress = bar()
    task = lambda: compute.generation(model, IDS, 200, 32, None, None, 1.0, _progress=progress)  # noqa: E731
    run_then_stop(task, moving(progress))


def test_generation_stops_in_its_prompt_forward(monkeypatch, prepared):
    model, _, _ = prepared
    progress = bar()
    prompt = tuple(range(1, 200))
    task = lambda: compute.generation(model, prompt, 8, 256, None, None, 1.0, _progress=progress)  # noqa: E731
    run_then_stop(task, lambda: progress.updates > 0 and progress.done == 0)


def test_patching_stops(monkeypatch, prepared):
    model, _, _ = prepared
    corrupted = intervention_compute.corrupt(IDS, 2, 99)
    progress = bar()
    task = lambda: intervention_compute.patching(  # noqa: E731
        model, IDS, corrupted, 32, STATE, "each", "denoising", 1.0, 0, "logit_diff", 5, 6, batch_size=64,
        _progress=progress,
    )  # fmt: skip
    run_then_stop(task, moving(progress))


@pytest.mark.parametrize("mode", ["add", "rotate"])
def test_steering_stops(monkeypatch, prepared, mode):
    model, _, traj = prepared
    h = model.config.n_embd
    vector = np.ones(h, dtype=np.float32)
    plane = np.eye(2, h, dtype=np.float32)
    progress = bar()
    task = lambda: intervention_compute.steering(  # noqa: E731
        model, IDS, 64, vector, plane, mode, 1.0, (1, 64), _progress=progress
    )
    run_then_stop(task, moving(progress))


@pytest.mark.parametrize("action", ["token plane", "mean difference", "answer"])
def test_the_forwards_before_steering_and_after_patching_stop(monkeypatch, prepared, action):
    """The steering direction's forwards and the patching answers' forward: each shows a bar,
    and Stop ends it at a core iteration."""
    model, _, _ = prepared
    bars: list[compute.TaskProgress] = []
    made = intervention_compute.forwards_progress
    monkeypatch.setattr(
        intervention_compute, "forwards_progress", lambda *a: bars.append(made(*a)) or bars[-1]
    )
    long = tuple(range(1, 120))
    task = {
        "token plane": lambda: intervention_compute.token_plane(model, long, 256, 3),
        "mean difference": lambda: intervention_compute.mean_difference(
            model, ("a long prompt " * 8,), ("another one " * 8,), 256
        ),
        "answer": lambda: intervention_compute.answer(model, long, 256, 1.0, 0),
    }[action]
    run_then_stop(task, lambda: bool(bars) and bars[-1].updates > 0)


def test_steered_continuations_stop(monkeypatch, prepared):
    model, _, _ = prepared
    vector = np.ones(model.config.n_embd, dtype=np.float32)
    progress = bar()
    task = lambda: intervention_compute.steered_text(  # noqa: E731
        model, IDS, 32, vector, None, "add", 1.0, (1, 32), 100, _progress=progress
    )
    run_then_stop(task, moving(progress))


def test_ablation_stops(monkeypatch, prepared):
    model, _, _ = prepared
    progress = bar()
    task = lambda: intervention_compute.ablation(  # noqa: E731
        model, IDS, 32, 3, 64, batch_size=4, _progress=progress
    )
    run_then_stop(task, moving(progress))


@pytest.mark.parametrize("phase", list(stability_compute.StabilityBar.PHASES))
def test_stability_stops_in_every_phase(monkeypatch, prepared, phase):
    model, run, traj = prepared
    monkeypatch.setattr(stability_compute, "BAR_INTERVAL", 0.0)
    phases = list(stability_compute.StabilityBar.PHASES)
    if phase != "fixed point":  # a short search, so that the later phases come sooner
        monkeypatch.setattr(stability_compute, "FIXED_POINT_PASSES", 5)
    if phases.index(phase) > 1:  # and the phases before this one's are not run (tested above)
        monkeypatch.setattr(stability_compute.workbench, "fixed_point_spectrum", _skipped)
    if phases.index(phase) > 2:
        monkeypatch.setattr(stability_compute, "lyapunov_run", _skipped)
    progress = stability_compute.stability_progress(3, guess())
    task = lambda: stability_compute.token_stability(model, traj, run, 3, 4, _progress=progress)  # noqa: E731
    run_then_stop(task, lambda: progress.phase == phase and progress.updates > 1)


def _skipped(*args, **kwargs) -> None:
    """Stands in for a phase before the one under test."""


def test_diffusion_stops(monkeypatch, prepared):
    model, _, _ = prepared
    progress = bar()
    task = lambda: compute.diffusion_run(  # noqa: E731
        model, IDS, 200, 32, 4, 1, 0.0, "latent-diff", 1.0, _progress=progress
    )
    run_then_stop(task, moving(progress))


def test_training_series_stops(monkeypatch, tmp_path):
    run_dir = tmp_path / "run"
    for step in (10, 20, 30):
        fallback_model(seed=step).save_pretrained(run_dir / "checkpoints" / f"step-{step:07d}")
    progress = bar()
    series = compute.CheckpointRun(run_dir)
    task = lambda: compute.checkpoint_series(  # noqa: E731
        series, "def add(a, b): return a + b", 64, tuple(range(8)), _progress=progress
    )
    run_then_stop(task, moving(progress))


def test_umap_stops_and_its_process_ends(monkeypatch, prepared):
    _, _, traj = prepared
    umap_worker.WORKER.stop()
    progress = compute.TaskProgress("UMAP", "s", cost.umap_estimate(100))
    task = lambda: compute.umap(traj, _progress=progress)  # noqa: E731
    running = lambda: umap_worker.WORKER.pid is not None and progress.updates > 0  # noqa: E731
    pid = []
    run_then_stop(task, lambda: running() and not pid.append(umap_worker.WORKER.pid))
    assert umap_worker.WORKER.pid is None
    with pytest.raises(ProcessLookupError):  # killed and reaped: its CPU is free
        import os

        os.kill(pid[0], 0)


def test_the_umap_process_answers_in_one_line():
    with pytest.raises(umap_worker.WorkerError, match="unknown request 'nothing'"):
        umap_worker.WORKER.fit(("nothing", None), lambda: None)
    umap_worker.WORKER.stop()


SESSION_SCRIPT = """
import pathlib, sys, time
sys.path.insert(0, {root!r})
from apps import compute, cost
from apps.cached import with_key
from recurrent_model.hook_names import STATE
from recurrent_model.standin import fallback_model

beat, ended = pathlib.Path({beat!r}), pathlib.Path({ended!r})
model = with_key(fallback_model(), "session-end-test")


def slow(x, hook):
    beat.write_text(str(time.time()))
    time.sleep(0.005)


progress = compute.TaskProgress("Generating", "tokens", cost.CostEstimate(1e9, 1e9, 1.0))
try:
    with model.hooks([(STATE, slow)]):
        compute.generation(model, (1, 2, 3), 400, 64, None, None, 1.0, _progress=progress)
finally:
    ended.write_text("ended")
"""


def test_a_closed_browser_session_ends_its_work(tmp_path):
    """A served script's session opened over the websocket as a browser does; once its work
    runs, the connection closes, and the work must end within BOUND_S (no browser needed)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from streamlit.proto.BackMsg_pb2 import BackMsg
    from websockets.sync.client import connect

    from apps import serve

    beat, ended, script = tmp_path / "beat", tmp_path / "ended", tmp_path / "app.py"
    root = str(Path(__file__).resolve().parents[1])
    script.write_text(SESSION_SCRIPT.format(root=root, beat=str(beat), ended=str(ended)))
    port = serve.free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--server.fileWatcherType", "none"],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false"),
    )  # fmt: skip
    try:
        serve.wait_healthy(f"http://127.0.0.1:{port}", server, 60)
        with connect(f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=["streamlit"]) as ws:
            rerun = BackMsg()
            rerun.rerun_script.query_string = ""
            ws.send(rerun.SerializeToString())
            deadline = time.monotonic() + 90
            while not beat.exists() and time.monotonic() < deadline:
                try:
                    ws.recv(timeout=0.1)
                except TimeoutError:
                    pass
            assert beat.exists(), "the session's work did not start"
            time.sleep(0.5)
            assert not ended.exists(), "the work ended before the session closed"
        closed = time.monotonic()
        while not ended.exists() and time.monotonic() - closed < 30:
            time.sleep(0.02)
        took = time.monotonic() - closed
        assert ended.exists() and took < BOUND_S, f"the work ran {took:.1f} s past the close"
        last = beat.read_text()
        time.sleep(0.5)
        assert beat.read_text() == last  # no iteration ran after it ended
    finally:
        serve.stop(server)


def _stopped_steering(monkeypatch):
    """A weak reference to a fresh model whose steering was stopped."""
    import weakref

    model = slowed(with_key(fallback_model(seed=6), f"stop-test|{uuid.uuid4()}"))
    vector = np.ones(model.config.n_embd, dtype=np.float32)
    progress = bar()
    task = lambda: intervention_compute.steering(  # noqa: E731
        model, IDS, 64, vector, None, "add", 1.0, (1, 64), _progress=progress
    )
    run_then_stop(task, moving(progress))
    return weakref.ref(model)


def test_a_stopped_action_keeps_no_reference_to_its_model(monkeypatch):
    import gc

    held = _stopped_steering(monkeypatch)
    stop_driver.TASK.clear()
    stop_driver.Recording.made.clear()
    gc.collect()
    assert held() is None, [type(r).__name__ for r in gc.get_referrers(held())]


def test_switching_models_frees_the_old_one_and_its_analyses():
    """After lenses, generation, steering and steered continuations on one model, another dtype
    is loaded: the first model is collected, and the memory line is a measured one."""
    import gc
    import weakref
    from pathlib import Path

    app = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
    at = AppTest.from_file(app, default_timeout=240).run()
    at.number_input(key="steps").set_value(4)
    at.text_input(key="seeds").set_value("0")
    at.run()
    for view in ("Lenses", "Generation", "Interventions"):
        at.session_state["view"] = view
        at.run()
    at.radio(key="intervention_tool").set_value("Steering").run()
    at.number_input(key="steer_new").set_value(2).run()
    at.button(key="steer_generate").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.text_area(key="steer_text").value is not None  # the continuations ran
    memory = [c.value for c in at.sidebar.caption if c.value.startswith("In memory")][0]
    assert "resident in this server process" in memory, memory
    first = weakref.ref(compute.model_slot().model)
    at.selectbox(key="dtype").set_value("bfloat16").run()
    assert not at.exception, at.exception
    gc.collect()
    assert first() is None, [type(r).__name__ for r in gc.get_referrers(first())]
    at.selectbox(key="dtype").set_value("checkpoint's own").run()


def test_finished_actions_calibrate_their_next_estimate(monkeypatch):
    """Steering, steered continuations, stability and UMAP: a finished run's measured time sets
    the ratio the next estimate of the same action includes."""
    model = with_key(fallback_model(seed=7), f"stop-test|{uuid.uuid4()}")
    vector = np.ones(model.config.n_embd, dtype=np.float32)
    first = intervention_compute.steering_estimate(model, len(IDS), 4, "add", 1.0)
    progress = compute.TaskProgress("Steering", "forwards", first)
    intervention_compute.steering(
        model, IDS, 4, vector, None, "add", 1.0, (1, 4), _progress=progress
    )
    forwards = intervention_compute.steering_forwards("add", 1.0)
    assert progress.done == progress.total == forwards  # counted by the hook
    again = intervention_compute.steering_estimate(model, len(IDS), 4, "add", 1.0)
    assert again.calibration == pytest.approx(progress.elapsed / first.uncalibrated_seconds)

    first = intervention_compute.steered_text_estimate(model, len(IDS), 3, 4)
    progress = compute.TaskProgress("Generating", "forwards", first)
    intervention_compute.steered_text(
        model, IDS, 4, vector, None, "add", 1.0, (1, 4), 3, _progress=progress
    )
    again = intervention_compute.steered_text_estimate(model, len(IDS), 3, 4)
    assert again.calibration == pytest.approx(progress.elapsed / first.uncalibrated_seconds)
    assert progress.done == progress.total == 2 * (1 + 3)  # the forwards, counted by the hook

    guess = stability_compute.estimate(model, 4, 8, 2)
    guess.done(3.0 * guess.seconds)
    assert stability_compute.estimate(model, 4, 8, 2).calibration == pytest.approx(3.0, rel=0.5)

    monkeypatch.setattr(cost, "_UMAP_RATIOS", {})
    umap = cost.umap_estimate(500)
    umap.done(2.0 * umap.seconds)
    assert cost.umap_estimate(500).calibration == pytest.approx(2.0)
    assert "from the last fit" in cost.umap_estimate(500).describe()


def test_a_lens_chunk_stays_small_at_a_large_models_size():
    from recurrent_model import preset

    small, huge = fallback_model().config, preset("huginn-0125")
    assert compute.lens_chunk_bytes(small, 40, "coda") == compute.LENS_CHUNK_BYTES  # as before
    for kind in ("coda", "logit"):
        chunk = compute.lens_chunk_bytes(huge, 40, kind)
        assert chunk // (40 * huge.vocab_size * 12) == 1  # one state per chunk
        assert cost.lens_flops(huge, 40, 0, kind) > compute.LENS_CHUNK_FLOPS  # and no fewer
