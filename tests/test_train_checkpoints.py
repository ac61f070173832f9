"""Checkpoint safety in one process: a relaunch without --resume is refused and changes nothing, a
resume past the stop step says so, the export cadence and dtype, exact resume from a checkpoint that
was not exported, pruning off the critical path, RNG states across device counts, per-rank state
size at 4096 ranks, the allocator setting, the out-of-memory snapshot and the profiler."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from helpers import tree_digest
from safetensors import safe_open
from safetensors.torch import load_file

import recurrent_model
from pretrain import checkpointing as ck
from pretrain.launch import main as launch_main

TINY = dict(
    docs=60,
    max_steps=6,
    checkpoint_every=2,
    keep_last=5,
    val_every=100,
    health_every=100,
    export_every=2,
    export_dtype="bfloat16",
)


@pytest.fixture(scope="module")
def tiny_run(tiny):
    """A 6-step run with a checkpoint every 2 steps, exported every second one in bfloat16."""
    root, config = tiny
    run = root / "run"
    assert launch_main(["--config", str(config), "--out", str(run)]) == 0
    return root, config, run


def test_relaunch_without_resume_is_refused_and_changes_nothing(tiny_run, capsys):
    _, config, run = tiny_run
    before = tree_digest(run)
    capsys.readouterr()
    assert launch_main(["--config", str(config), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0] and "new --out" in err[0], err
    assert tree_digest(run) == before


def test_resume_at_or_past_max_steps_says_so_and_writes_nothing(tiny_run, capsys):
    _, config, run = tiny_run
    before = tree_digest(run)
    capsys.readouterr()
    args = ["--config", str(config), "--out", str(run), "--resume", "--max-steps", "4"]
    assert launch_main(args) == 0
    out = capsys.readouterr().out
    assert "is at step 6, at or past the stop step 4" in out and "nothing to train" in out
    assert '"loss": null' not in out and '"loss"' not in out
    assert tree_digest(run) == before


def test_export_cadence_and_dtype(tiny_run):
    _, _, run = tiny_run
    ckpts = run / "checkpoints"
    exported = {step: ck.is_exported(ckpts / ck.step_name(step)) for step in (2, 4, 6)}
    assert exported == {2: False, 4: True, 6: True}  # every 2nd checkpoint, and the last
    for step in (2, 4, 6):
        state = ck.read_state(ckpts / ck.step_name(step))
        assert state["exported"] is exported[step] and "ranks" not in state
    with safe_open(ckpts / "step-0000006" / "model.safetensors", framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    model = recurrent_model.load_model(ckpts / "step-0000006")
    assert model.config.n_embd == 32
    # The shards a resume reads stay float32.
    shards = load_file(next((ckpts / "step-0000006" / ck.SHARDS_DIR).glob("*-00001-of-*")))
    assert {v.dtype for v in shards.values()} == {torch.float32}


def test_load_model_opens_a_checkpoint_that_was_not_exported(tiny_run, tmp_path):
    _, _, run = tiny_run
    step2 = run / "checkpoints" / "step-0000002"
    before = tree_digest(step2)
    model = recurrent_model.load_model(step2, dtype=torch.float32)
    ck.consolidate_checkpoint(step2, tmp_path / "export")
    reference = recurrent_model.load_model(tmp_path / "export", dtype=torch.float32)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert model.lm_head.weight is model.transformer.wte.weight
    assert tree_digest(step2) == before  # reading the shards writes nothing


def test_resume_from_a_checkpoint_that_was_not_exported_is_exact(tiny_run, tmp_path):
    _, config, run = tiny_run
    copy = tmp_path / "copy"
    (copy / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(run / "checkpoints" / "step-0000002", copy / "checkpoints" / "step-0000002")
    (copy / "checkpoints" / "latest").write_text("step-0000002\n")
    args = ["--config", str(config), "--out", str(copy), "--resume", "--max-steps", "4"]
    assert launch_main(args) == 0
    for name in ("model-00001-of-00002", "model-00002-of-00002"):
        [a] = (run / "checkpoints" / "step-0000004" / ck.SHARDS_DIR).glob(f"*-{name}.*")
        [b] = (copy / "checkpoints" / "step-0000004" / ck.SHARDS_DIR).glob(f"*-{name}.*")
        ta, tb = load_file(a), load_file(b)
        assert ta.keys() == tb.keys()
        assert all(torch.equal(ta[k], tb[k]) for k in ta), name


def test_step_time_spread_is_logged(tiny_run):
    _, _, run = tiny_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # one rank: min = median = max = its own time
        assert r["step_time_min_s"] == r["step_time_median_s"] == r["step_time_max_s"]
        assert r["step_time_max_s"] == r["step_time_s"]


# Pruning ------------------------------------------------------------------------------------------
def fake_checkpoint(directory: ck.CheckpointDirectory, step: int) -> None:
    path = directory.path(step)
    path.mkdir(parents=True)
    (path / ck.STATE_JSON).write_text("{}")


def test_pruning_runs_in_the_background_and_spares_latest_and_writes(tmp_path, monkeypatch):
    from cluster.context import DistContext
    from pretrain.checkpoint_manager import CheckpointManager

    directory = ck.CheckpointDirectory(tmp_path, keep_last=1)
    for step in (1, 2, 3):
        fake_checkpoint(directory, step)
    (tmp_path / ck.LATEST).write_text("step-0000001\n")  # latest names an old one: kept
    writing = directory.staging_path(5)
    writing.mkdir()
    leftover = tmp_path / ".step-0000004.tmp-1-deadbeef"
    leftover.mkdir()
    release = threading.Event()
    real_rmtree = ck.shutil.rmtree

    def slow_rmtree(path, ignore_errors=False):
        release.wait(30)
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(ck.shutil, "rmtree", slow_rmtree)
    manager = CheckpointManager(directory, DistContext())
    started = time.perf_counter()
    manager._prune_in_background()
    assert time.perf_counter() - started < 1.0  # returned while the deletion is held
    assert directory.steps() == [1, 2, 3]
    release.set()
    manager.close()
    assert directory.steps() == [1, 3]  # the newest and the one latest names
    assert writing.is_dir() and not leftover.exists()


# RNG states ---------------------------------------------------------------------------------------
def test_rng_restores_when_the_visible_device_count_changes(monkeypatch):
    """A rank's own GPU's state restores on any device count; a state saved for several visible
    devices is not applied to a different count, and restore says so."""
    saved = torch.arange(16, dtype=torch.uint8)
    set_states: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda index=0: saved)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda s, index=0: set_states.append((index, s))
    )
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: set_states.append(("all", s)))
    state = ck.capture_rng(device=torch.device("cuda", 5))  # rank 5 saw 8 devices
    notes = ck.restore_rng(state, device=torch.device("cuda", 0))  # 1 visible (--gpu-bind)
    assert notes == [] and len(set_states) == 1
    assert set_states[0][0] == 0 and torch.equal(set_states[0][1], saved)
    set_states.clear()
    legacy = dict(state, cuda=[ck._b64(saved)] * 8)  # format 2: every visible device's state
    del legacy["cuda_device"]
    notes = ck.restore_rng(legacy, device=torch.device("cuda", 0))
    assert set_states == [] and len(notes) == 1 and "8 visible device(s)" in notes[0]
    notes = ck.restore_rng(state, device=torch.device("cpu"))
    assert set_states == [] and "runs on the CPU" in notes[0]


def test_rng_of_a_generator_on_another_device_type_is_reported():
    gen = torch.Generator().manual_seed(3)
    state = ck.capture_rng({"noise": gen})
    state["generators"]["noise"]["device"] = "cuda"
    notes = ck.restore_rng(state, {"noise": gen})
    assert len(notes) == 1 and "'noise' was saved on cuda" in notes[0]


# Per-rank state -----------------------------------------------------------------------------------
def test_trainer_state_per_rank_stays_small_at_4096_ranks(tmp_path, capsys):
    """Each rank writes and reads only its own file; the shared trainer_state.json does not grow
    with the rank count. The per-rank file is measured for rank 4095 of 4096 on a GPU rank's
    contents (CPU generators here; a CUDA state adds 16 bytes)."""
    from pretrain.data import PackedLoader  # noqa: F401 - the state below is the loader's shape

    world = 4096
    loader = {
        "version": 1,
        "split": "train",
        "epoch": 3,
        "index": 123456,
        "seed": 0,
        "rank": world - 1,
        "world_size": world,
        "num_rows": 200_000_000,
    }
    gens = {"noise": torch.Generator().manual_seed(1)}
    per_rank = ck.write_rank_state(
        tmp_path, world - 1, {"loader": loader, "rng": ck.capture_rng(gens)}
    )
    assert per_rank == ck.rank_file(tmp_path, world - 1).stat().st_size
    assert ck.read_rank_state(tmp_path, world - 1, {})["loader"] == loader
    shared = {"step": 1000, "world_size": world, "config": {"train": {}}, "schedule": {}}
    ck.write_state_json(tmp_path, shared)
    shared_bytes = (tmp_path / ck.STATE_JSON).stat().st_size
    with capsys.disabled():  # the measurement, printed in every run of the test
        print(
            f"\ntrainer state at {world} ranks: {per_rank} bytes per rank file (each rank reads "
            f"its own), {shared_bytes} bytes shared; one file with every rank's would be "
            f"{per_rank * world / 2**20:.1f} MiB, read by every rank"
        )
    assert per_rank < 2**20
    assert "ranks" not in json.loads((tmp_path / ck.STATE_JSON).read_text())


# Allocator, out-of-memory, profiler ---------------------------------------------------------------
def test_allocator_expandable_segments_unless_set():
    from pretrain.launch import configure_allocator

    env: dict[str, str] = {}
    configure_allocator(env)
    assert env == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True",
    }
    mine = {"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    configure_allocator(mine)
    assert mine == {"PYTORCH_HIP_ALLOC_CONF": "garbage_collection_threshold:0.6"}


def test_out_of_memory_writes_a_snapshot_on_gpu_and_says_so_on_cpu(tmp_path, monkeypatch):
    from pretrain.metrics import memory_snapshot_on_oom

    line = memory_snapshot_on_oom(torch.device("cpu"), tmp_path, 3)
    assert "rank 3" in line and "no memory snapshot" in line
    written = []
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", written.append)
    line = memory_snapshot_on_oom(torch.device("cuda", 0), tmp_path, 3)
    assert written == [str(tmp_path / "memory" / "oom-rank-00003.pickle")]
    assert "memory snapshot written to" in line


def test_out_of_memory_in_a_step_is_reported_and_raised(tiny_run, tmp_path, monkeypatch, capsys):
    _, config, _ = tiny_run
    import pretrain.trainer as tr

    def oom(self):
        raise torch.OutOfMemoryError("CUDA out of memory (test)")

    monkeypatch.setattr(tr.Trainer, "train_step", oom)
    with pytest.raises(torch.OutOfMemoryError):
        launch_main(["--config", str(config), "--out", str(tmp_path / "oom")])
    assert "out of memory on the cpu: no memory snapshot" in capsys.readouterr().out


def test_profile_steps_writes_a_trace(tiny_run, tmp_path):
    _, config, _ = tiny_run
    run = tmp_path / "profiled"
    overrides = ["--set", "train.profile_steps=1", "--set", "train.max_steps=2"]
    assert launch_main(["--config", str(config), "--out", str(run), *overrides]) == 0
    trace = json.loads((run / "profile" / "trace-rank-00000.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("aten::" in name for name in names)


def test_a_failed_publish_leaves_latest_and_stops_with_a_named_error(
    tiny_run, tmp_path, monkeypatch
):
    """Synchronous saves take the same path: trainer_state.json of step 4 cannot be written, so
    step 4 is not published, ``latest`` stays on step 2 and the run exits 1 with one line."""
    _, config, _ = tiny_run
    import pretrain.checkpoint_manager as cm

    real = cm.write_state_json

    def failing(directory, state):
        if state["step"] == 4:
            raise OSError("disk full (test)")
        real(directory, state)

    monkeypatch.setattr(cm, "write_state_json", failing)
    run = tmp_path / "full"
    args = ["--set", "train.max_steps=6", "--set", "train.export_every=1"]
    assert launch_main(["--config", str(config), "--out", str(run), *args]) == 1
    ckpts = run / "checkpoints"
    assert (ckpts / ck.LATEST).read_text().strip() == "step-0000002"
    assert ck.CheckpointDirectory(ckpts).steps() == [2]
    assert not any(p.name.startswith(".step-0000004") for p in ckpts.iterdir())


def test_latest_without_its_pointer_is_the_newest_complete_checkpoint(tmp_path):
    directory = ck.CheckpointDirectory(tmp_path)
    assert directory.latest() is None
    for step in (2, 4):
        fake_checkpoint(directory, step)
    (tmp_path / ".step-0000006.tmp-1-deadbeef").mkdir()  # an unfinished write is not complete
    assert directory.latest() == directory.path(4)
    (tmp_path / ck.LATEST).write_text("step-0000002\n")
    assert directory.latest() == directory.path(2)


def test_pruning_keeps_the_newest_exported_checkpoint(tmp_path):
    directory = ck.CheckpointDirectory(tmp_path, keep_last=2)
    for step in (2, 4, 6, 8, 10):
        fake_checkpoint(directory, step)
    (directory.path(4) / ck.SINGLE_FILE).write_bytes(b"")  # exported
    (tmp_path / ck.LATEST).write_text("step-0000010\n")
    assert directory.prune() == [2, 6]
    assert directory.steps() == [4, 8, 10]


@pytest.mark.parametrize("ending", ["returns", "write_fails", "raises"])
def test_no_trainer_is_alive_when_the_process_group_goes(tiny_run, tmp_path, monkeypatch, ending):
    """``train`` destroys the process group last: by then the trainer (and DDP's reducer, whose
    destructor would hang gloo's exit) must be unreachable, however the run ended."""
    import weakref

    import cluster.context as context
    import pretrain.trainer as tr
    from pretrain.checkpoint_manager import CheckpointWriteError
    from pretrain.config import load_config
    from pretrain.launch import train

    made: list[weakref.ref] = []
    alive_at_shutdown: list[bool] = []

    class EndingTrainer:
        def __init__(self, *args, **kwargs) -> None:
            made.append(weakref.ref(self))
            self.cycle = self

        def run(self) -> dict:
            if ending == "write_fails":
                raise CheckpointWriteError("checkpoint step 2 was not published (test)")
            if ending == "raises":
                raise RuntimeError("a step failed (test)")
            return {"step": 2, "nothing_to_train": True}

    monkeypatch.setattr(tr, "Trainer", EndingTrainer)
    monkeypatch.setattr(
        context, "shutdown", lambda: alive_at_shutdown.append(made[0]() is not None)
    )
    config = load_config(tiny_run[1], [])
    if ending == "raises":
        with pytest.raises(RuntimeError, match="a step failed"):
            train(config, tmp_path / "run")
    else:
        assert train(config, tmp_path / "run") == (1 if ending == "write_fails" else 0)
    assert alive_at_shutdown == [False]
