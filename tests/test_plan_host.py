"""The plan's host and I/O section, simulated for the published 4096-rank 3.5B config: host memory
per node below the device memory it feeds, few data files per rank, a small per-rank trainer state,
and the checkpoint's bytes and seconds at a stated bandwidth."""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain.config import load_config
from pretrain.launch import main as launch_main
from pretrain.plan import DEVICES, count_parameters
from pretrain.plan_host import checkpoint_bytes, data_reads, plan_host_io, simulated_shard_rows

FRONTIER = (
    Path(__file__).resolve().parent.parent / "pretrain" / "configs" / "huginn-3.5b-frontier.yaml"
)
P = 3_564_976_800
MIB = 2**20


@pytest.fixture(scope="module")
def frontier_host():
    config = load_config(FRONTIER)
    counts = count_parameters(config.model_config())
    return config, plan_host_io(config, DEVICES["mi250x"], 512, 8, "hsdp", counts, 50.0)


def test_published_layout_is_about_twelve_thousand_shards():
    shards = simulated_shard_rows(load_config(FRONTIER), 4096)
    assert 11_000 < len(shards) < 13_000  # 47,000 steps x 4096 rows of 4097 uint16 tokens
    assert shards[0] == (128 * MIB) // (4097 * 2)


def test_4096_ranks_host_memory_files_and_state(frontier_host):
    _, plan = frontier_host
    assert plan.fits
    assert plan.build_bytes_per_node == 8 * 4 * 65536 * 5280  # one embedding-sized tensor per rank
    assert plan.build_bytes_per_node < plan.device_bytes_per_node / 10
    assert plan.save_bytes_per_node < plan.device_bytes_per_node
    assert plan.shards_read_per_rank <= 8  # ~12,000 shards over 4096 ranks: a contiguous run each
    assert plan.files_per_rank <= 3 * plan.shards_read_per_rank
    assert plan.trainer_state_bytes < MIB


def test_checkpoint_bytes_and_seconds_at_the_stated_bandwidth(frontier_host):
    _, plan = frontier_host
    ck = checkpoint_bytes(P, 65536 * 5280, 4096, 8, 8, 4 * P)
    assert ck.total == 12 * P and ck.per_rank == 4 * (65536 * 5280 // 8)  # the largest item
    assert ck.local_state == 12 * P // 8
    rows = {r.name: r for r in plan.rows}
    assert rows["seconds per checkpoint at 50 GB/s"].value == f"{12 * P / 50e9:.1f}"


def test_data_reads_one_shard_per_rank_when_shards_match_lanes():
    reads = data_reads([10] * 8, world=8, rows_per_rank=10)
    assert reads.rows == 80 and reads.shards_read_max <= 2 and reads.opens_max <= 2


def test_plan_prints_the_host_section_and_refuses_a_bad_bandwidth(capsys):
    assert launch_main(["--config", str(FRONTIER), "--plan", "--fs-bandwidth", "25"]) == 0
    out = capsys.readouterr().out
    for line in (
        "host memory per node, building",
        "host memory per node, saving",
        "data files opened per rank",
        "checkpoint bytes per rank",
        "checkpoint bytes, all ranks",
        "seconds per checkpoint at 25 GB/s",
        "trainer state per rank",
    ):
        assert line in out
    assert launch_main(["--config", str(FRONTIER), "--plan", "--fs-bandwidth", "0"]) == 2
    assert "--fs-bandwidth must be > 0" in capsys.readouterr().err
