"""``PackedLoader``: batches of packed rows, disjoint per rank, with an exact, resumable position that
survives a change of the rank count, and that opens only the shards a rank reads.

The order. The train split is an infinite *stream*: epoch after epoch of the rows, each epoch in its
own order over the shards — the shards in a seeded permutation, the rows of each shard in a seeded
permutation of their own (``EpochOrder``). Stream position p is row ``p % N`` of epoch ``p // N`` in
that order. The val split is one pass in storage order.

The dealing. Ranks read the stream in *rounds* (``RowDealer``): a round is the next ``W * L`` stream
positions (``L = N // W``, so a round is about one epoch), cut into ``W`` contiguous lanes, and rank r
reads lane r from its start, ``batch_size`` rows per step. All ranks read at the same pace, so every
lane ends at the same step and the next round starts; a batch may straddle two rounds. A rank thus
reads one contiguous run of the epoch's order, the rows of about ``N / (W · rows per shard) + 1``
shards, and opens only those (``RowStore`` opens shards on first use and keeps a few open).

The state. ``state_dict`` is the dealer's global position: the current round (its stream ranges,
rank count, lane length and rows read per lane), the stream ranges still owed to a round, and the
next fresh stream position. It is the same on every rank. Resumed on the same rank count it continues
the round exactly; on another rank count the unread tails of the old lanes are owed first and the new
ranks deal them out, so every stream position is read exactly once whatever the rank counts.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .config import DataError, PreparedData

STATE_VERSION = 2
FD_MARGIN = 256  # descriptors left for everything else (sockets, logs, checkpoints)
OPEN_SHARDS = 4  # memory-mapped shards a loader keeps open (a batch spans at most two)

Ranges = list[tuple[int, int]]


def raise_open_file_limit(needed: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` towards the hard limit when ``needed`` more descriptors would
    not fit (every open memory-mapped shard keeps one); returns the soft limit now in force."""
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


# The order of an epoch ----------------------------------------------------------------------------
class EpochOrder:
    """Each epoch's order of the rows over shards of ``shard_rows`` rows (pure metadata: no files).

    ``shuffle``: shards in a permutation seeded by (seed, epoch), rows within each shard in one seeded
    by (seed, epoch, shard); else storage order. Global row ids count the shards in storage order.
    """

    def __init__(self, shard_rows: Sequence[int], seed: int, shuffle: bool) -> None:
        self.shard_rows = np.asarray(shard_rows, dtype=np.int64)
        self.row_offsets = np.concatenate([[0], np.cumsum(self.shard_rows)])
        self.num_rows = int(self.row_offsets[-1])
        self.seed, self.shuffle = seed, shuffle
        self._shards: tuple[int, np.ndarray, np.ndarray] | None = None
        self._within: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def shard_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(the shards in visiting order, the epoch position where each starts, plus the end)."""
        if self._shards is None or self._shards[0] != epoch:
            order = np.arange(len(self.shard_rows))
            if self.shuffle:
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
                order = rng.permutation(len(self.shard_rows))
            starts = np.concatenate([[0], np.cumsum(self.shard_rows[order])])
            self._shards = (epoch, order, starts)
        return self._shards[1], self._shards[2]

    def _rows_within(self, epoch: int, shard: int) -> np.ndarray:
        key = (epoch, shard)
        if key not in self._within:
            n = int(self.shard_rows[shard])
            rows = np.arange(n, dtype=np.int64)
            if self.shuffle:
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, shard]))
                rows = rng.permutation(n)
            self._within[key] = rows + self.row_offsets[shard]
            if len(self._within) > OPEN_SHARDS:
                self._within.popitem(last=False)
        return self._within[key]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Global row ids at stream positions ``start … stop − 1`` (may cross epochs)."""
        parts = []
        for epoch, a, b in self._by_epoch(start, stop):
            order, starts = self.shard_order(epoch)
            for i in range(np.searchsorted(starts, a, "right") - 1, len(order)):
                if starts[i] >= b:
                    break
                lo, hi = max(a, starts[i]) - starts[i], min(b, starts[i + 1]) - starts[i]
                parts.append(self._rows_within(epoch, int(order[i]))[lo:hi])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def shards(self, start: int, stop: int) -> list[int]:
        """The shards (in visiting order) that stream positions ``start … stop − 1`` read."""
        out: list[int] = []
        for epoch, a, b in self._by_epoch(start, stop):
            order, starts = self.shard_order(epoch)
            first = np.searchsorted(starts, a, "right") - 1
            last = np.searchsorted(starts, b - 1, "right") - 1
            out += [int(s) for s in order[first : last + 1]]
        return out

    def _by_epoch(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(epoch, first, end) pieces of the stream range, in epoch positions."""
        pieces, n = [], self.num_rows
        while start < stop:
            epoch, offset = divmod(start, n)
            take = min(stop - start, n - offset)
            pieces.append((epoch, offset, offset + take))
            start += take
        return pieces


# The dealing ---------------------------------------------------------------------------------------
def _take(ranges: Ranges, count: int) -> tuple[Ranges, Ranges]:
    """The first ``count`` positions of ``ranges`` (as ranges) and the rest."""
    head: Ranges = []
    rest = list(ranges)
    while count > 0 and rest:
        a, b = rest[0]
        n = min(count, b - a)
        head.append((a, a + n))
        count -= n
        rest[0] = (a + n, b)
        if a + n == b:
            rest.pop(0)
    return head, rest


def _slice(ranges: Ranges, start: int, stop: int) -> Ranges:
    """Positions ``start … stop − 1`` of the sequence that ``ranges`` concatenate."""
    out: Ranges = []
    seen = 0
    for a, b in ranges:
        lo, hi = max(start - seen, 0), min(stop - seen, b - a)
        if lo < hi:
            out.append((a + lo, a + hi))
        seen += b - a
        if seen >= stop:
            break
    return out


class RowDealer:
    """Deals stream positions to ``world_size`` ranks in rounds of lanes (module docstring).

    ``num_rows`` is the epoch length N; ``repeat=False`` deals one round only (the val pass)."""

    def __init__(self, num_rows: int, world_size: int, repeat: bool = True) -> None:
        self.num_rows, self.world_size, self.repeat = num_rows, world_size, repeat
        self.lane = num_rows // world_size
        self.cursor = 0  # the next stream position no round has taken
        self.owed: Ranges = []  # positions taken from the stream but not in a round yet
        self.round: Ranges = []
        self.read = 0  # rows read so far of every lane of the round
        self._new_round()

    def _new_round(self) -> None:
        size = self.world_size * self.lane
        head, self.owed = _take(self.owed, size)
        fresh = size - sum(b - a for a, b in head)
        if fresh:
            head.append((self.cursor, self.cursor + fresh))
            self.cursor += fresh
        self.round, self.read = head, 0

    def take(self, rank: int, count: int) -> Ranges:
        """The stream ranges of rank ``rank``'s next ``count`` rows; every rank calls it alike."""
        out: Ranges = []
        while count > 0:
            if self.read == self.lane:
                if not self.repeat:
                    break
                self._new_round()
            n = min(count, self.lane - self.read)
            start = rank * self.lane + self.read
            out += _slice(self.round, start, start + n)
            self.read += n
            count -= n
        return out

    def unread(self) -> Ranges:
        """Stream positions below the cursor that no rank has read yet: the lanes' unread tails,
        then what is owed."""
        tails = []
        for rank in range(self.world_size):
            start = rank * self.lane + self.read
            tails += _slice(self.round, start, (rank + 1) * self.lane)
        return tails + self.owed

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "owed": [list(r) for r in self.owed],
            "round": [list(r) for r in self.round],
            "world_size": self.world_size,
            "lane": self.lane,
            "read": self.read,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the same round on the same rank count, else a new round that
        deals the old lanes' unread tails first."""
        saved = RowDealer.__new__(RowDealer)
        saved.num_rows, saved.repeat = self.num_rows, self.repeat
        saved.cursor = int(state["cursor"])
        saved.owed = [(int(a), int(b)) for a, b in state["owed"]]
        saved.round = [(int(a), int(b)) for a, b in state["round"]]
        saved.world_size, saved.lane = int(state["world_size"]), int(state["lane"])
        saved.read = int(state["read"])
        if sum(b - a for a, b in saved.round) != saved.world_size * saved.lane or not (
            0 <= saved.read <= saved.lane
        ):
            raise DataError(f"loader state round {state['round']} / read {saved.read} is invalid")
        if saved.world_size == self.world_size:
            self.__dict__.update(copy.deepcopy(saved.__dict__))
            return
        self.cursor, self.owed = saved.cursor, saved.unread()
        self._new_round()


# Rows from files ------------------------------------------------------------------------------------
class RowStore:
    """The rows of one split, memory-mapped from its ``.npy`` shards on first use, at most
    ``OPEN_SHARDS`` open at a time; ``opens`` counts the files opened."""

    def __init__(self, prepared: PreparedData, split: str) -> None:
        self.shards = prepared.shard_paths(split)
        self.row_length = prepared.block_size + 1
        self.offsets = np.cumsum([0] + [rows for _, rows in self.shards])
        self.num_rows = int(self.offsets[-1])
        self.opens = 0
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()
        raise_open_file_limit(2 * OPEN_SHARDS)  # both splits are open in a training process

    def _array(self, shard: int) -> np.ndarray:
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard]
        path, rows = self.shards[shard]
        try:
            array = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot open shard {path}: {exc}") from exc
        if array.ndim != 2 or array.shape != (rows, self.row_length):
            raise DataError(
                f"shard {path} has shape {array.shape}, expected ({rows}, {self.row_length})"
            )
        self.opens += 1
        self._open[shard] = array
        if len(self._open) > OPEN_SHARDS:
            self._open.popitem(last=False)
        return array

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """Rows at global ``indices``, in that order, as int64."""
        shard = np.searchsorted(self.offsets, indices, side="right") - 1
        out = np.empty((len(indices), self.row_length), dtype=np.int64)
        for s in dict.fromkeys(shard.tolist()):  # first-use order: at most two per batch
            mask = shard == s
            local = indices[mask] - self.offsets[s]
            order = np.argsort(local)
            out[np.flatnonzero(mask)[order]] = self._array(s)[local[order]]
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
        self.split, self.batch_size, self.seed = split, batch_size, seed
        self.rank, self.world_size = rank, world_size
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
        rows = [r for _, r in self.store.shards]
        self.order = EpochOrder(rows, seed, shuffle=split == "train")
        self.dealer = RowDealer(self.store.num_rows, world_size, repeat=split == "train")

    def __len__(self) -> int:
        """Batches per round on this rank (the val pass length; train rounds down)."""
        if self.split == "val":
            return -(-self.rows_per_rank // self.batch_size)
        return self.rows_per_rank // self.batch_size

    def __iter__(self) -> PackedLoader:
        if self.split == "val":
            self.dealer = RowDealer(self.store.num_rows, self.world_size, repeat=False)
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        ranges = self.dealer.take(self.rank, self.batch_size)
        if not ranges:
            raise StopIteration
        indices = np.concatenate([self.order.rows(a, b) for a, b in ranges])
        rows = torch.from_numpy(self.store.gather(indices))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        """The global data position (the same on every rank), JSON-serialisable."""
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "seed": self.seed,
            "num_rows": self.store.num_rows,
            "dealer": self.dealer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, saved by any rank of a run on any number of ranks: on the same
        rank count the next batch is the one that followed; on another, every row not yet read is
        still read exactly once."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("split", "seed", "num_rows"):
            if state[key] != mine[key]:
                raise DataError(
                    f"loader state is for {key}={state[key]!r} but this loader has {mine[key]!r}"
                )
        self.dealer.load_state_dict(state["dealer"])
