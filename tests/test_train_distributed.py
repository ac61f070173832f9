"""Two ranks over gloo, started by ``launch.py --nproc 2`` (torchrun): lock-step depths, identical
parameters after several steps, disjoint data, per-rank loader state in the checkpoint; DDP, the
recipe's bucketed all-reduce and FSDP2 train the same model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, losses
from safetensors.torch import load_file

from pretrain.checkpointing import read_rank_state

# The corpus and train settings of the ``tiny`` fixture (conftest.py).
TINY = dict(max_steps=4, checkpoint_every=4, health_every=100, val_every=4)


def launch_two_ranks(
    root: Path, config: Path, out: Path, *overrides: str, extra: tuple[str, ...] = ()
) -> list[dict]:
    """Run launch.py --nproc 2 into ``out``; each rank's report (rank_callbacks.StepReport)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}",
        PRETRAIN_PEAK_FLOPS="1e11",
    )
    cmd = [
        sys.executable,
        "pretrain/launch.py",
        "--config",
        str(config),
        "--out",
        str(out),
        "--nproc",
        "2",
        "--callback",
        "rank_callbacks:StepReport",
        *extra,
    ]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "preflight: 5 all-reduces up to 0.05 MiB" in proc.stdout  # 4, 8, 16, 32, 51.2 KiB
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def launch_strategy(root: Path, config: Path, strategy: str) -> tuple[Path, list[dict]]:
    """Two ranks of ``strategy`` for the 4 steps; bucket_mb small: gradients span a few buckets
    and the embedding is split across two."""
    out = root / strategy
    reports = launch_two_ranks(
        root,
        config,
        out,
        f"distributed.strategy={strategy}",
        "distributed.bucket_mb=0.02",
        "distributed.preflight_mb=0.05",
    )
    return out, reports


@pytest.fixture(scope="module")
def ddp_run(tiny) -> tuple[Path, list[dict]]:
    """The DDP run every other strategy is compared with, made once per module by whichever test
    needs it first (so each test also runs alone)."""
    root, config = tiny
    return launch_strategy(root, config, "ddp")


def assert_lock_step_identical_disjoint(out: Path, reports: list[dict]) -> None:
    r0, r1 = reports
    assert r0["world"] == r1["world"] == 2
    assert r0["depths"] == r1["depths"] and len(r0["depths"]) == 4
    assert len({tuple(d[1:]) for d in r0["depths"]}) > 1  # the depth does vary by step
    assert r0["params"] == r1["params"]
    assert len(r0["rows"]) == len(r1["rows"]) == 8
    assert set(r0["rows"]).isdisjoint(r1["rows"])
    checkpoint = out / "checkpoints" / "step-0000004"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["world_size"] == 2
    loaders = [read_rank_state(checkpoint, r, state)["loader"] for r in range(2)]
    assert loaders[0] == loaders[1]  # the data position is global: any rank's resumes any count


@pytest.mark.slow
@pytest.mark.slow
def test_ddp_two_ranks_lock_step_identical_parameters_disjoint_data(ddp_run):
    assert_lock_step_identical_disjoint(*ddp_run)


@pytest.mark.slow
@pytest.mark.slow
def test_bucketed_two_ranks_train_like_ddp(tiny, ddp_run):
    root, config = tiny
    out, reports = launch_strategy(root, config, "bucketed")
    assert_lock_step_identical_disjoint(out, reports)
    assert_same_as_ddp(ddp_run[0], out)


def assert_same_as_ddp(ddp_out: Path, out: Path) -> None:
    ddp = load_file(ddp_out / "checkpoints" / "step-0000004" / "model.safetensors")
    mine = load_file(out / "checkpoints" / "step-0000004" / "model.safetensors")
    assert ddp.keys() == mine.keys()
    for key in ddp:  # atan2 without ε turns rounding in near-zero moments into ~1e-6 differences
        torch.testing.assert_close(mine[key], ddp[key], rtol=1e-4, atol=1e-5)
    assert losses(out) == pytest.approx(losses(ddp_out), rel=1e-6)


@pytest.mark.slow
@pytest.mark.slow
def test_fsdp_trains_like_ddp_and_resumes(tiny, ddp_run):
    """FSDP2 (fully_shard per block): 2 steps, a new job with --resume for 2 more (sharded moments
    gathered into the checkpoint and re-sharded), and the result matches the 4-step DDP run."""
    root, config = tiny
    out = root / "fsdp"
    launch_two_ranks(
        root,
        config,
        out,
        "distributed.strategy=fsdp",
        "distributed.preflight_mb=0.05",
        extra=("--max-steps", "2"),
    )
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-0000002"
    r0, r1 = launch_two_ranks(
        root,
        config,
        out,
        "distributed.strategy=fsdp",
        "distributed.preflight_mb=0.05",
        extra=("--resume",),
    )
    assert r0["params"] == r1["params"] and r0["depths"] == r1["depths"]
    assert [d[0] for d in r0["depths"]] == [2, 3]  # continued at step index 2
    assert_same_as_ddp(ddp_run[0], out)


def test_bucketed_all_reduce_packs_splits_and_averages(tmp_path):
    """One gloo rank, told the world has 2: every gradient comes back exactly halved, whether it
    shared a bucket, filled one, or was split across several."""
    import torch.distributed as dist

    from pretrain.distributed import bucketed_all_reduce

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        shapes = [(3, 5), (7,), (40, 3), (2,)]  # bucket of 32 floats: the (40, 3) is split
        params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
        for i, p in enumerate(params):
            p.grad = torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) + i
        want = [p.grad.clone() / 2 for p in params]
        n = bucketed_all_reduce(params, world_size=2, bucket_bytes=32 * 4)
        for p, w in zip(params, want):
            assert torch.equal(p.grad, w)
        assert n == 1 + 4 + 1  # [15 + 7], the 120-float tensor in 4 pieces, [2]
    finally:
        dist.destroy_process_group()
