"""Sharded strategies and DCP checkpoints over gloo: hsdp (4 ranks as 2 "nodes" × 2) trains like DDP;
an fsdp run saved on 3 ranks resumes on 2 and back on 3 with exactly the saved weights and moments and
continues like the straight run; kill -9 during an asynchronous save leaves ``latest`` loadable; no
checkpoint file is a pickle."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, launch
from safetensors import safe_open
from safetensors.torch import load_file

import recurrent_model
from pretrain.checkpointing import SHARDS_DIR, CheckpointDirectory, read_state

# The corpus and train settings of the ``tiny`` fixture (conftest.py).
TINY = dict(
    docs=240,
    max_steps=6,
    micro_batch_size=1,
    checkpoint_every=2,
    keep_last=5,
    health_every=100,
    val_every=100,
    val_batches=1,
    warmup_steps=1,
)


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def read_sharded(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP safetensors directory, assembled from all ranks' shards (one process)."""
    import torch.distributed.checkpoint as dcp

    meta = dcp.HuggingFaceStorageReader(str(directory)).read_metadata()
    out = {
        k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for k, m in meta.state_dict_metadata.items()
    }
    dcp.load(out, storage_reader=dcp.HuggingFaceStorageReader(str(directory)))
    return out


def assert_equal_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def resume_copy(source: Path, step: int, target: Path) -> None:
    """A run directory holding ``source``'s checkpoint ``step`` as its latest."""
    name = f"step-{step:07d}"
    (target / "checkpoints").mkdir(parents=True)
    shutil.copytree(source / "checkpoints" / name, target / "checkpoints" / name)
    (target / "checkpoints" / "latest").write_text(name + "\n")
    lines = (source / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    (target / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))


@pytest.mark.slow
def test_hsdp_two_nodes_of_two_trains_like_ddp(tiny):
    root, config = tiny
    common = ("--set", "train.max_steps=3")
    launch(root, config, root / "ddp4", 4, "distributed.strategy=ddp", extra=common)
    launch(
        root,
        config,
        root / "hsdp4",
        4,
        "distributed.strategy=hsdp",
        "distributed.shard_size=2",
        extra=common,
    )
    # DDP's reducer must not outlive the group: its destructor would hang gloo's exit.
    assert [(root / "ddp4" / f"live_ddp{r}").read_text() for r in range(4)] == ["0"] * 4
    ddp = load_file(root / "ddp4" / "end_params.safetensors")
    hsdp = load_file(root / "hsdp4" / "end_params.safetensors")
    assert ddp.keys() == hsdp.keys()
    for key in ddp:  # atan2 without ε turns rounding in near-zero moments into ~1e-6 differences
        torch.testing.assert_close(hsdp[key], ddp[key], rtol=1e-4, atol=1e-5)
    assert list(losses(root / "hsdp4").values()) == pytest.approx(
        list(losses(root / "ddp4").values()), rel=1e-5
    )
    state = read_state(root / "hsdp4" / "checkpoints" / "step-0000003")
    assert state["world_size"] == 4 and state["strategy"] == "hsdp"
    # The core block is gathered once per step although it runs r + k times forward and k times
    # backward; a prelude block is gathered again for its backward.
    steps = json.loads((root / "hsdp4" / "gathers.json").read_text())
    assert len(steps) == 3 and max(s["depth"] for s in steps) > 1
    for s in steps:
        assert s["transformer.core_block.0"] == 1 and s["transformer.core_block.1"] == 1, s
        assert s["transformer.prelude.0"] == 2, s


@pytest.mark.slow
def test_fsdp_saved_on_3_resumes_on_2_and_back_on_3(tiny):
    """3 ranks fsdp -> 2 ranks fsdp -> 3 ranks bucketed (ZeRO-1): DCP re-slices every tensor."""
    root, config = tiny
    fsdp = "distributed.strategy=fsdp"
    straight = root / "fsdp3"
    launch(root, config, straight, 3, fsdp)  # qk_bias has 2 rows: one rank holds empty shards
    resume_copy(straight, 2, root / "on2")
    launch(root, config, root / "on2", 2, fsdp, extra=("--resume", "--max-steps", "4"))
    resume_copy(root / "on2", 4, root / "on3")
    launch(root, config, root / "on3", 3, "distributed.strategy=bucketed", extra=("--resume",))

    for run, source in ((root / "on2", straight), (root / "on3", root / "on2")):
        saved = source / "checkpoints" / ("step-0000002" if run.name == "on2" else "step-0000004")
        # Each new rank read exactly the saved weights and moments, whatever wrote them.
        assert_equal_tensors(
            load_file(run / "start_params.safetensors"), load_file(saved / "model.safetensors")
        )
        weights = load_file(saved / "model.safetensors")
        moments = load_file(run / "start_optim.safetensors")
        saved_moments = {
            k: v for k, v in read_sharded(saved / SHARDS_DIR).items() if k not in weights
        }
        if run.name == "on3":  # ZeRO-1: rank 0 holds the moments of its share of the parameters
            assert 0 < len(moments) < len(saved_moments)
            saved_moments = {k: saved_moments[k] for k in moments}
        assert_equal_tensors(moments, saved_moments)
        optimizer_files = (saved / SHARDS_DIR).glob("*-model-00002-of-00002.safetensors")
        assert len(list(optimizer_files)) == read_state(saved)["world_size"]
    # The same weights and moments on fewer or more ranks, with the rows dealt anew: the losses
    # continue those of the straight run within the batch-to-batch spread of this tiny corpus.
    a, b, c = losses(straight), losses(root / "on2"), losses(root / "on3")
    assert sorted(b) == [1, 2, 3, 4] and sorted(c) == [1, 2, 3, 4, 5, 6]
    for step in (3, 4):
        assert b[step] == pytest.approx(a[step], rel=0.05)
    for step in (5, 6):
        assert c[step] == pytest.approx(a[step], rel=0.05)
    end_a = load_file(straight / "end_params.safetensors")
    end_c = load_file(root / "on3" / "end_params.safetensors")
    for key in end_a:  # 4 updates of lr 3e-3 after the resume: close, not equal
        torch.testing.assert_close(end_c[key], end_a[key], rtol=0, atol=2e-2)
    model = recurrent_model.load_model(root / "on3" / "checkpoints" / "step-0000006")
    assert model.config.n_embd == 32
    for run in (straight, root / "on2", root / "on3"):
        assert_no_pickle(run / "checkpoints")


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["every rank", "one rank of 2"])
def test_kill_9_during_async_save_leaves_latest_loadable(tiny, tmp_path, killed):
    root, config = tiny
    run = tmp_path / "async"
    marker = tmp_path / "writing"
    env = {"SLOW_CHECKPOINT": ".step-0000004.tmp-", "SLOW_MARKER": str(marker)}
    if killed == "one rank of 2":
        env["SLOW_RANK"] = "1"  # rank 0 finishes its write; rank 1 dies in the middle of its own
    proc = launch(
        root,
        config,
        run,
        2,
        "distributed.strategy=fsdp",
        "distributed.async_checkpoint=true",
        env=env,
        wait=False,
    )
    assert proc is not None
    deadline = time.monotonic() + 240
    metrics = run / "metrics.jsonl"
    # Training goes on while the step-4 shards are being written in the background.
    while not (
        marker.exists() and metrics.is_file() and len(metrics.read_text().splitlines()) >= 5
    ):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_run(proc, tmp_path)
            raise AssertionError(f"the run ended or stalled early:\n{proc.communicate()[0]}")
        time.sleep(0.1)
    if killed == "one rank of 2":
        os.kill(int((tmp_path / "writing.pid1").read_text()), signal.SIGKILL)
        try:  # the other rank stops (its collectives fail, or torchrun ends it)
            output = proc.communicate(timeout=150)[0]
        except subprocess.TimeoutExpired:
            kill_run(proc, tmp_path)
            raise
        assert proc.returncode != 0, output
    else:
        kill_run(proc, tmp_path)
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-0000002"
    assert not (ckpts / "step-0000004").exists()
    latest = ckpts / "step-0000002"
    assert read_state(latest)["step"] == 2
    assert recurrent_model.load_model(latest).config.n_embd == 32
    assert_no_pickle(ckpts)


@pytest.mark.slow
def test_async_write_failure_on_one_rank_is_not_published(tiny, tmp_path):
    """Rank 1's write of the step-4 shards fails in the background: neither rank publishes it,
    ``latest`` stays on step 2, the run stops with a named error and a non-zero exit."""
    root, config = tiny
    run = tmp_path / "failing"
    proc = launch(
        root,
        config,
        run,
        2,
        "distributed.strategy=fsdp",
        "distributed.async_checkpoint=true",
        env={"FAIL_CHECKPOINT": ".step-0000004.tmp-", "FAIL_RANK": "1"},
        wait=False,
    )
    assert proc is not None
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, output
    assert "checkpoint step 4 was not published: the write failed (rank 1: OSError(" in output, (
        output[-3000:]
    )
    assert "latest still names step-0000002" in output
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-0000002"
    assert CheckpointDirectory(ckpts).steps() == [2]
    assert not any(p.name.startswith(".step-0000004") for p in ckpts.iterdir())
    # Both saves were staged through one stager per rank, kept across saves (pinned on a GPU).
    for rank in (0, 1):
        stagers = (run / f"stagers{rank}").read_text().split("\n")[:-1]
        assert len(stagers) == 2 and len(set(stagers)) == 1 and "DefaultStager" in stagers[0]


@pytest.mark.slow
def test_sigusr1_to_one_rank_checkpoints_and_stops_every_rank(tiny, tmp_path):
    """SIGUSR1 reaches rank 1 only (as when a scheduler signals one task): the ranks agree through
    a collective, write the step-3 checkpoint together and stop. Then a relaunch without --resume
    is refused before any rank starts."""
    root, config = tiny
    run = tmp_path / "signalled"
    proc = launch(
        root, config, run, 2, "distributed.strategy=ddp", env={"HOLD_AT_STEP": "2"}, wait=False
    )
    assert proc is not None
    deadline = time.monotonic() + 240
    while not ((run / "reached0").exists() and (run / "reached1").exists()):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the run ended or stalled early:\n{proc.communicate()[0]}")
        time.sleep(0.05)
    os.kill(int((run / "pid1").read_text()), signal.SIGUSR1)
    (run / "go").touch()
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode == 0, output[-3000:]
    assert "signal received: checkpoint at step 3 written" in output
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-0000003"
    final = ckpts / "step-0000003"
    assert sorted(p.name for p in (final / "ranks").iterdir()) == [
        "rank-000000.json",
        "rank-000001.json",
    ]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # the spread of the step time over the 2 ranks
        assert r["step_time_min_s"] <= r["step_time_median_s"] <= r["step_time_max_s"]
        assert r["step_time_median_s"] == pytest.approx(
            (r["step_time_min_s"] + r["step_time_max_s"]) / 2
        )
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    cmd = [sys.executable, "pretrain/launch.py", "--config", str(config), "--out", str(run)]
    again = subprocess.run(
        [*cmd, "--nproc", "2"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "pass --resume" in again.stderr and "new --out" in again.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def kill_run(proc: subprocess.Popen, tmp_path: Path) -> None:
    """kill -9 the ranks (torchrun starts each in its own session) and the launcher's group."""
    for pid_file in tmp_path.glob("writing.pid*"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


PICKLE_PROTOCOL_MARKERS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


def assert_no_pickle(directory: Path) -> None:
    """Every file is JSON, a tokenizer, or a safetensors file (8-byte header length, JSON header,
    raw tensor bytes); none is a pickle or a torch.save zip."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert files
    for path in files:
        head = path.read_bytes()[:8]
        assert not head.startswith(PICKLE_PROTOCOL_MARKERS) and not head.startswith(b"PK"), path
        if path.suffix == ".safetensors":
            with safe_open(path, framework="pt") as f:
                list(f.keys())
        elif path.name == "latest":
            assert path.read_text().strip().startswith("step-")
        else:
            assert path.suffix == ".json", path
            json.loads(path.read_text())


def test_gpu_is_local_rank_modulo_visible_devices(monkeypatch):
    """Under ``--gpu-bind=closest`` each task sees one device: LOCAL_RANK 5 must use cuda:0."""
    from cluster.context import pick_device

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("auto", 5) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert pick_device("cuda", 13) == torch.device("cuda", 5)
    assert pick_device("cuda:2", 13) == torch.device("cuda", 2)
    assert chosen == [0, 5, 2]


def test_hsdp_shard_group_is_one_node(monkeypatch):
    from cluster.context import DistContext
    from pretrain.distributed import ranks_per_node

    ctx = DistContext(rank=0, local_rank=0, world_size=4096)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8(x512)")
    assert ranks_per_node(ctx) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert ranks_per_node(ctx) == 4
    assert ranks_per_node(ctx, configured=16) == 16
    with pytest.raises(ValueError, match="does not divide the world size"):
        ranks_per_node(DistContext(world_size=6), configured=4)


def test_consolidation_plan_balances_files_over_ranks():
    from pretrain.checkpointing import consolidation_plan

    model = recurrent_model.RecurrentLM(
        recurrent_model.preset("tiny", n_embd=32, n_heads=2, intermediate_size=64, vocab_size=320)
    )
    sizes = {k: v.numel() * 4 for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert set(consolidation_plan(model, ranks=8).values()) == {1}  # 0.2 MB: one file
    plan = consolidation_plan(model, ranks=3, file_bytes=1)  # at most one file per rank
    assert plan.keys() == sizes.keys() and set(plan.values()) == {1, 2, 3}
    loads = [sum(sizes[k] for k, i in plan.items() if i == f) for f in (1, 2, 3)]
    assert max(loads) <= sum(sizes.values()) / 3 + max(sizes.values())


def test_atomic_write_keeps_the_old_content_when_interrupted(tmp_path, monkeypatch):
    from recurrent_model import atomic_io

    target = tmp_path / "latest"
    atomic_io.atomic_write_text(target, "step-0000002\n")

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_io.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_io.atomic_write_text(target, "step-0000004\n")
    assert target.read_text() == "step-0000002\n"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]  # no temporary file left
