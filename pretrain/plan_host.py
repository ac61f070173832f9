"""The host and I/O side of a training plan: host memory per node while building and while saving,
data files opened per rank, bytes and seconds per checkpoint, and the per-rank trainer state.

Pure arithmetic and simulation on metadata (no files, no process group), printed by ``python
pretrain/launch.py --plan`` under the memory plan. What each number assumes:

- building (``pretrain.distributed.build_model``): the model is made on the meta device, sharded,
  and each rank fills one full-size float32 host tensor at a time (the largest: the embedding), so a
  node holds ``ranks per node x 4 x largest tensor`` besides each process's own baseline.
- saving: DCP writes float32 weights and Adam moments once (replicated copies deduplicated; each
  replicated item goes to one of its holders, balanced by size): 12 bytes per parameter in total,
  per rank about ``total / ranks`` and at least its largest item. An asynchronous save first stages
  the rank's whole local state in host memory; a synchronous one holds at most what it writes.
  Every ``train.export_every`` checkpoints the weights are also consolidated into the Huginn layout
  (``train.export_dtype``), files of about 1 GiB written in parallel.
- data: the loader's own dealing (``pretrain.data.loader``) run on shard row counts: the run's
  rows (one pass of ``max_steps`` global batches) in shards of ``pretrain.data.packing.SHARD_BYTES``,
  or the prepared manifest's shards when given.
- trainer state per rank: the loader's state (JSON; also right after a resize, when the first round
  lists the old lanes' tails) and the RNG states (Python, NumPy, torch CPU, and the device's
  generator and the s_0 noise generator: 16 bytes each on a GPU, torch's CPU state on the CPU).
"""

from __future__ import annotations

import json
import pickle
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pretrain.config import TrainConfig
from pretrain.data.loader import EpochOrder, RowDealer
from pretrain.data.packing import SHARD_BYTES, row_dtype
from pretrain.plan import (
    Device,
    MemoryPlan,
    ParameterCounts,
    PlanError,
    count_parameters,
    shard_counts,
)

GIB = 2**30
MIB = 2**20
EXPORT_FILE_BYTES = 1 * GIB
DEFAULT_FS_BANDWIDTH_GBS = 100.0  # an assumption to be replaced by the file system's figure
GPU_GENERATOR_BYTES = 16  # a CUDA/ROCm Philox generator: seed and offset
# Checksum throughput of one core, GB/s: assumptions (XXH3 runs near memory speed, SHA-256 with
# the CPU's SHA extensions about 1-2 GB/s), to be replaced by a measurement on the cluster.
HASH_GBS = {"xxh3_128": 10.0, "sha256": 1.0}


@dataclass(frozen=True)
class HostRow:
    name: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class DataReads:
    """Files a rank opens over the run, from the loader's dealing on shard row counts."""

    shards: int
    rows: int
    opens_max: int
    opens_median: float
    shards_read_max: int  # distinct shards the busiest rank reads


@dataclass
class HostPlan:
    rows: list[HostRow]
    build_bytes_per_node: int
    save_bytes_per_node: int
    device_bytes_per_node: int
    files_per_rank: int
    shards_read_per_rank: int
    trainer_state_bytes: int

    @property
    def fits(self) -> bool:
        """Host memory per node stays below the device memory it feeds, building and saving."""
        return max(self.build_bytes_per_node, self.save_bytes_per_node) < self.device_bytes_per_node


def simulated_shard_rows(config: TrainConfig, world: int) -> list[int]:
    """Shard row counts of a corpus of exactly one pass of the run: ``max_steps`` global batches of
    rows, packed as pretrain/data/packing.py packs them."""
    t = config.train
    rows = t.max_steps * t.micro_batch_size * t.grad_accum * world
    row_bytes = (config.data.block_size + 1) * row_dtype(config.data.vocab_size).itemsize
    per_shard = max(1, SHARD_BYTES // row_bytes)
    full, rest = divmod(rows, per_shard)
    return [per_shard] * full + ([rest] if rest else [])


def _opens(shards: list[int]) -> int:
    """Files opened reading shards in this sequence (a run of one shard is one open)."""
    return sum(1 for i, s in enumerate(shards) if i == 0 or s != shards[i - 1])


def data_reads(
    shard_rows: Sequence[int], world: int, rows_per_rank: int, seed: int = 0
) -> DataReads:
    """Each rank's opens when it reads ``rows_per_rank`` rows through the loader's dealing."""
    order = EpochOrder(shard_rows, seed, shuffle=True)
    opens, distinct = [], []
    for rank in range(world):
        dealer = RowDealer(order.num_rows, world)
        shards = [s for a, b in dealer.take(rank, rows_per_rank) for s in order.shards(a, b)]
        opens.append(_opens(shards))
        distinct.append(len(set(shards)))
    return DataReads(
        len(shard_rows), order.num_rows, max(opens), statistics.median(opens), max(distinct)
    )


def loader_state_bytes(num_rows: int, world: int) -> int:
    """JSON bytes of the loader state: the larger of mid-round on ``world`` ranks and right after a
    resize from there to half as many ranks (its round then lists the old lanes' tails)."""
    dealer = RowDealer(num_rows, world)
    dealer.take(0, dealer.lane // 2)  # the position is global: every rank's is this one
    resized = RowDealer(num_rows, max(1, world // 2))
    resized.load_state_dict(dealer.state_dict())
    wrapper = {"version": 2, "split": "train", "seed": 0, "num_rows": num_rows}
    return max(len(json.dumps({**wrapper, "dealer": d.state_dict()})) for d in (dealer, resized))


def rng_state_bytes(accelerator: bool) -> int:
    """Pickled Python, NumPy and torch CPU RNG states plus the device and s_0 noise generators."""
    host = len(pickle.dumps((random.getstate(), np.random.get_state(), torch.get_rng_state())))
    devices = 2 * (GPU_GENERATOR_BYTES if accelerator else torch.get_rng_state().numel())
    return host + devices


@dataclass(frozen=True)
class CheckpointBytes:
    total: int  # DCP shards, all ranks
    per_rank: int  # the busiest rank
    local_state: int  # one rank's weights and moments (what an async save stages)
    export: int  # one Huginn-layout export


def checkpoint_bytes(
    parameters: int, largest_tensor: int, world: int, shard: int, opt_shard: int, export_bytes: int
) -> CheckpointBytes:
    """Bytes of one checkpoint (the module docstring's assumptions); ``shard`` / ``opt_shard``:
    ranks sharing the weights / the moments (pretrain.plan.shard_counts)."""
    total = 12 * parameters
    largest_item = 4 * -(-largest_tensor // shard)  # one tensor's local piece: weight, m or v
    per_rank = max(-(-total // world), largest_item)
    weights = -(-4 * parameters // shard)
    moments = -(-8 * parameters // opt_shard)
    if opt_shard > shard:  # ZeRO-1 hands out whole tensors: one rank holds the largest
        moments = max(moments, 8 * largest_tensor)
    return CheckpointBytes(total, per_rank, weights + moments, export_bytes)


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def plan_host_io(
    config: TrainConfig,
    device: Device,
    nodes: int,
    gpus_per_node: int,
    strategy: str,
    counts: ParameterCounts,
    fs_bandwidth_gbs: float = DEFAULT_FS_BANDWIDTH_GBS,
    shard_rows: Sequence[int] | None = None,
) -> HostPlan:
    """The host and I/O plan of ``config`` on ``nodes`` x ``gpus_per_node`` ranks (module docstring);
    ``shard_rows``: the train shards' row counts (default: simulated from the config)."""
    if fs_bandwidth_gbs <= 0:
        raise PlanError(f"--fs-bandwidth must be > 0 GB/s, got {fs_bandwidth_gbs}")
    world, t = nodes * gpus_per_node, config.train
    shard, opt_shard = shard_counts(strategy, nodes, gpus_per_node, config.distributed.shard_size)
    export_bytes = counts.total * (2 if getattr(t, "export_dtype", "float32") == "bfloat16" else 4)
    ck = checkpoint_bytes(
        counts.total, counts.largest_tensor, world, shard, opt_shard, export_bytes
    )
    staged = ck.local_state if config.distributed.async_checkpoint else ck.per_rank
    layout = list(shard_rows) if shard_rows is not None else simulated_shard_rows(config, world)
    reads = data_reads(layout, world, t.max_steps * t.micro_batch_size * t.grad_accum, t.seed)
    state = loader_state_bytes(reads.rows, world) + rng_state_bytes(device.accelerator)
    plan = HostPlan(
        rows=[],
        build_bytes_per_node=gpus_per_node * 4 * counts.largest_tensor,
        save_bytes_per_node=gpus_per_node * max(staged, min(EXPORT_FILE_BYTES, export_bytes)),
        device_bytes_per_node=int(gpus_per_node * device.memory_gib * GIB),
        files_per_rank=reads.opens_max,
        shards_read_per_rank=reads.shards_read_max,
        trainer_state_bytes=state,
    )
    plan.rows = _host_rows(plan, config, ck, reads, gpus_per_node, fs_bandwidth_gbs, world)
    return plan


def _host_rows(
    plan: HostPlan,
    config: TrainConfig,
    ck: CheckpointBytes,
    reads: DataReads,
    gpus_per_node: int,
    bandwidth: float,
    world: int = 1,
) -> list[HostRow]:
    """The printed rows of a host plan."""
    mode = (
        "async: each rank stages its local state"
        if config.distributed.async_checkpoint
        else ("sync: each rank holds at most what it writes")
    )
    export_every = getattr(config.train, "export_every", 1)
    cadence = {0: "at the end only", 1: "every checkpoint"}.get(
        export_every, f"every {export_every} checkpoints"
    )
    return [
        HostRow(
            "host memory per node, building",
            gib(plan.build_bytes_per_node),
            f"{gpus_per_node} ranks x one full fp32 tensor at a time (meta, shard, then init)",
        ),
        HostRow("host memory per node, saving", gib(plan.save_bytes_per_node), mode),
        HostRow("device memory per node", gib(plan.device_bytes_per_node), "what the host feeds"),
        HostRow(
            "data files opened per rank",
            f"{reads.opens_max} (median {reads.opens_median:g})",
            f"over the run; the busiest rank reads {reads.shards_read_max} of {reads.shards:,} "
            "shards (one contiguous lane per round)",
        ),
        HostRow("checkpoint bytes per rank", gib(ck.per_rank), "fp32 weights + Adam, the busiest"),
        HostRow("checkpoint bytes, all ranks", gib(ck.total), "replicated items written once"),
        HostRow("files written per rank", "3", "model shards, optimizer shards, own state"),
        HostRow(
            f"seconds per checkpoint at {bandwidth:g} GB/s",
            f"{ck.total / (bandwidth * 1e9):.1f}",
            f"+ {ck.export / (bandwidth * 1e9):.1f} s export ({gib(ck.export)}) {cadence}",
        ),
        checksum_row(ck, world),
        timeout_row(config, (ck.total + ck.export) / (bandwidth * 1e9)),
        HostRow(
            "trainer state per rank",
            f"{plan.trainer_state_bytes / 1024:.1f} KiB",
            "loader position (also after a resize) + RNG states",
        ),
    ]


def checksum_row(ck: CheckpointBytes, world: int) -> HostRow:
    """The checksum cost of one checkpoint: each rank hashes what it writes while writing it; a
    resume verifies every file once, each rank a share (pretrain/integrity.py)."""
    from pretrain.integrity import HASH_NAME

    rate = HASH_GBS[HASH_NAME] * 1e9
    verify = -(-ck.total // world)
    return HostRow(
        "checksums per checkpoint",
        f"{ck.per_rank / rate:.2f} s per rank",
        f"{HASH_NAME} while writing, at an assumed {HASH_GBS[HASH_NAME]:g} GB/s per core; a "
        f"resume verifies {gib(verify)} per rank ({verify / rate:.2f} s)",
    )


def timeout_row(config: TrainConfig, checkpoint_s: float) -> HostRow:
    """The collective timeouts (pretrain/watchdog.py): the start-up length through the first step,
    then ``distributed.step_timeout_s`` on every group, which a checkpoint's write (with its
    export) must stay under; and SIGTERM's grace."""
    d = config.distributed
    note = (
        f"from step 2 on, every group; a checkpoint with its export (~{checkpoint_s:.1f} s) runs "
        f"under it; SIGTERM: {d.stop_grace_s:g} s to reach the stop"
    )
    if checkpoint_s >= d.step_timeout_s:
        note = (
            f"TOO SHORT: a checkpoint with its export (~{checkpoint_s:.1f} s) runs under it; "
            "raise distributed.step_timeout_s"
        )
    return HostRow(
        "collective timeout",
        f"{d.timeout_minutes} min start-up, {d.step_timeout_s:g} s per step",
        note,
    )


def format_host_plan(plan: HostPlan) -> str:
    """The host and I/O table for the terminal."""
    from tabulate import tabulate

    table = [[r.name, r.value, r.note] for r in plan.rows]
    return tabulate(table, headers=["host and I/O", "", ""], tablefmt="simple")


def host_plan_for(
    config: TrainConfig, plan: MemoryPlan, fs_bandwidth_gbs: float | None = None
) -> HostPlan:
    """The host and I/O plan beside a memory plan (its strategy, ranks and device)."""
    return plan_host_io(
        config,
        plan.device,
        plan.nodes,
        plan.gpus_per_node,
        plan.strategy,
        count_parameters(config.model_config()),
        DEFAULT_FS_BANDWIDTH_GBS if fs_bandwidth_gbs is None else fs_bandwidth_gbs,
    )
