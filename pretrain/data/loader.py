"""``PackedLoader``: batches of packed rows, disjoint per rank, with an exact, resumable position.

Rank ``r`` of ``W`` owns the rows ``r, r + W, r + 2W, …`` (the first ``W * (rows // W)`` rows, so every
rank has the same number and ranks stay in lock-step). The train split is an infinite stream: each
epoch visits the rank's rows in a fresh permutation derived from ``(seed, epoch, rank, world_size)``,
and a batch may straddle two epochs. The val split is one pass in order; its last batch may be smaller
than ``batch_size``. ``state_dict`` is the position (epoch, index into the epoch); the permutations are
recomputed from the seeds, so the state is small and JSON-serialisable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .config import DataError, PreparedData

STATE_VERSION = 1


FD_MARGIN = 256  # descriptors left for everything else (sockets, logs, checkpoints)


def raise_open_file_limit(needed: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` towards the hard limit when ``needed`` more descriptors would
    not fit (every memory-mapped shard keeps one open); returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + FD_MARGIN
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(hard, want)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


class RowStore:
    """The rows of one split, memory-mapped from its ``.npy`` shards."""

    def __init__(self, prepared: PreparedData, split: str) -> None:
        # both splits are open at once in a training process
        raise_open_file_limit(sum(len(v) for v in prepared.shards.values()))
        self.arrays = []
        for path, rows in prepared.shard_paths(split):
            try:
                array = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise DataError(f"cannot open shard {path}: {exc}") from exc
            if array.ndim != 2 or array.shape != (rows, prepared.block_size + 1):
                raise DataError(
                    f"shard {path} has shape {array.shape}, expected ({rows}, "
                    f"{prepared.block_size + 1})"
                )
            self.arrays.append(array)
        self.offsets = np.cumsum([0] + [len(a) for a in self.arrays])
        self.num_rows = int(self.offsets[-1])

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """Rows at global ``indices``, in that order, as int64."""
        shard = np.searchsorted(self.offsets, indices, side="right") - 1
        out = np.empty((len(indices), self.arrays[0].shape[1]), dtype=np.int64)
        for s in np.unique(shard):
            mask = shard == s
            local = indices[mask] - self.offsets[s]
            order = np.argsort(local)
            rows = self.arrays[s][local[order]]
            out[np.flatnonzero(mask)[order]] = rows
        return out


class PackedLoader:
    """Yields ``(inputs, labels)``: int64 tensors of shape (batch, block_size), labels shifted by one."""

    def __init__(
        self,
        prepared: PreparedData,
        split: str,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if split not in ("train", "val"):
            raise DataError(f"split must be 'train' or 'val', got {split!r}")
        if batch_size < 1:
            raise DataError(f"batch_size must be positive, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")
        self.store = RowStore(prepared, split)
        self.split = split
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.rows_per_rank = self.store.num_rows // world_size
        if self.rows_per_rank == 0:
            raise DataError(
                f"the {split} split has {self.store.num_rows} row(s), too few for {world_size} "
                "rank(s): prepare more data"
            )
        if split == "train" and self.rows_per_rank < batch_size:
            raise DataError(
                f"each rank has {self.rows_per_rank} train row(s), fewer than batch_size "
                f"{batch_size}: prepare more data or lower batch_size"
            )
        self.epoch = 0
        self.index = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    def __len__(self) -> int:
        """Batches per epoch on this rank (the val pass length; train rounds down)."""
        if self.split == "val":
            return -(-self.rows_per_rank // self.batch_size)
        return self.rows_per_rank // self.batch_size

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """This rank's global row indices for ``epoch``, in visiting order."""
        if self._order_epoch != epoch:
            own = np.arange(self.rows_per_rank, dtype=np.int64) * self.world_size + self.rank
            if self.split == "train":
                sequence = np.random.SeedSequence([self.seed, epoch, self.rank, self.world_size])
                own = own[np.random.default_rng(sequence).permutation(self.rows_per_rank)]
            self._order, self._order_epoch = own, epoch
        return self._order

    def __iter__(self) -> PackedLoader:
        if self.split == "val":
            self.epoch, self.index = 0, 0
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.split == "val":
            if self.index >= self.rows_per_rank:
                raise StopIteration
            stop = min(self.index + self.batch_size, self.rows_per_rank)
            indices = self._epoch_order(0)[self.index : stop]
            self.index = stop
        else:
            parts, needed = [], self.batch_size
            while needed:
                take = min(needed, self.rows_per_rank - self.index)
                parts.append(self._epoch_order(self.epoch)[self.index : self.index + take])
                self.index += take
                needed -= take
                if self.index == self.rows_per_rank:
                    self.epoch, self.index = self.epoch + 1, 0
            indices = np.concatenate(parts)
        rows = torch.from_numpy(self.store.gather(indices))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_rows": self.store.num_rows,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the next batch is the one that followed when it was saved."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("split", "seed", "rank", "world_size", "num_rows"):
            if state[key] != mine[key]:
                raise DataError(
                    f"loader state is for {key}={state[key]!r} but this loader has {mine[key]!r}"
                )
        if not 0 <= state["index"] <= self.rows_per_rank or state["epoch"] < 0:
            raise DataError(f"loader state position {state['epoch']}/{state['index']} is invalid")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
