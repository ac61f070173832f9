"""The loader's dealing: every row of the stream read exactly once across resumes on other rank
counts (3 -> 2 -> 3), each rank reading a contiguous run of few shards, and files opened only for
the shards a rank reads. Shards here are hand-written .npy files whose first column is the row id."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from pretrain.data import PackedLoader
from pretrain.data.config import PreparedData
from pretrain.data.loader import EpochOrder, RowDealer

BLOCK = 4


def _prepared(tmp_path, train_shard_rows, val_shard_rows=(5,)) -> PreparedData:
    """A prepared directory whose rows hold their global row id in column 0."""
    shards: dict[str, list] = {}
    for split, sizes in (("train", train_shard_rows), ("val", val_shard_rows)):
        entries, first = [], 0
        for i, n in enumerate(sizes):
            rows = np.zeros((n, BLOCK + 1), dtype=np.uint16)
            rows[:, 0] = np.arange(first, first + n)
            name = f"{split}-{i:05d}.npy"
            np.save(tmp_path / name, rows)
            entries.append([name, n, (tmp_path / name).stat().st_size, "-"])
            first += n
        shards[split] = entries
    return PreparedData(
        directory=tmp_path,
        tokenizer_path=tmp_path / "tokenizer.json",
        corpus_hash="test",
        train_rows=sum(train_shard_rows),
        val_rows=sum(val_shard_rows),
        block_size=BLOCK,
        vocab_size=2**16,
        stats={},
        shards=shards,
    )


def _ids(batch) -> list[int]:
    return batch[0][:, 0].tolist()


def _run(loaders: list[PackedLoader], steps: int) -> list[int]:
    """``steps`` lock-step batches from every rank: the row ids read."""
    return [i for _ in range(steps) for loader in loaders for i in _ids(next(loader))]


def _ranks(prepared, world: int, batch: int, state=None) -> list[PackedLoader]:
    loaders = [PackedLoader(prepared, "train", batch, r, world, seed=9) for r in range(world)]
    for r, loader in enumerate(loaders):
        if state is not None:  # any saved rank's state: here each new rank takes another one
            loader.load_state_dict(json.loads(json.dumps(state[r % len(state)])))
    return loaders


@pytest.mark.parametrize(("steps", "batch"), [((5, 7, 9), 2), ((1, 30, 4), 3), ((13, 2, 40), 1)])
def test_resize_3_2_3_reads_every_row_exactly_once(tmp_path, steps, batch):
    prepared = _prepared(tmp_path, [10, 7, 13, 9, 11])  # 50 rows, uneven shards
    read, state = [], None
    for world, n in zip((3, 2, 3), steps):
        loaders = _ranks(prepared, world, batch, state)
        read += _run(loaders, n)
        states = [loader.state_dict() for loader in loaders]
        assert all(s == states[0] for s in states)  # the position is global
        state = states
    dealer = loaders[0].dealer
    unread = [int(i) for a, b in dealer.unread() for i in loaders[0].order.rows(a, b)]
    # what was read plus what is still owed is the stream up to the cursor, each row once per epoch
    assert Counter(read + unread) == Counter(loaders[0].order.rows(0, dealer.cursor).tolist())
    assert len(read) == batch * (3 * steps[0] + 2 * steps[1] + 3 * steps[2])


def test_dealer_stream_positions_are_disjoint_across_resizes():
    """Metadata only: stream positions read by 3, then 2, then 3 ranks never repeat, and together
    with the unread ones they are exactly 0 … cursor − 1."""
    seen: list[int] = []
    state = None
    for world, steps in ((3, 11), (2, 17), (3, 23)):
        dealers = [RowDealer(101, world) for _ in range(world)]
        if state is not None:
            for d in dealers:
                d.load_state_dict(state)
        for _ in range(steps):
            for rank, d in enumerate(dealers):
                seen += [p for a, b in d.take(rank, 4) for p in range(a, b)]
        state = dealers[0].state_dict()
    unread = [p for a, b in dealers[0].unread() for p in range(a, b)]
    assert len(set(seen)) == len(seen)
    assert sorted(seen + unread) == list(range(dealers[0].cursor))


def test_same_rank_count_resume_is_exact(tmp_path):
    prepared = _prepared(tmp_path, [10, 7, 13, 9, 11])
    loaders = _ranks(prepared, 3, 2)
    _run(loaders, 9)  # past the first round (16 rows per lane)
    state = [loader.state_dict() for loader in loaders]
    expected = _run(loaders, 6)
    assert _run(_ranks(prepared, 3, 2, state), 6) == expected


def test_each_rank_opens_only_the_shards_of_its_lane(tmp_path):
    prepared = _prepared(tmp_path, [10] * 12)  # 120 rows; 4 ranks: lanes of 30 rows
    loaders = _ranks(prepared, 4, 5)
    read = _run(loaders, 6)  # one round: each rank its 30 rows
    assert sorted(read) == list(range(120))
    for rank, loader in enumerate(loaders):
        lane = loader.order.shards(rank * 30, (rank + 1) * 30)
        assert len(lane) <= 4  # 30 contiguous rows of 10-row shards
        assert loader.store.opens == len(lane)


def test_epoch_order_shuffles_shards_and_rows_within_them():
    order = EpochOrder([4, 4, 4], seed=1, shuffle=True)
    epoch0 = order.rows(0, 12).tolist()
    assert sorted(epoch0) == list(range(12)) and epoch0 != list(range(12))
    for start in range(0, 12, 4):  # each run of 4 positions is one shard's rows
        assert len({i // 4 for i in epoch0[start : start + 4]}) == 1
    assert order.rows(12, 24).tolist() != epoch0  # the next epoch, a new order
    assert EpochOrder([4, 4, 4], seed=1, shuffle=False).rows(0, 12).tolist() == list(range(12))


def test_val_is_one_contiguous_pass_per_rank(tmp_path):
    prepared = _prepared(tmp_path, [10, 10], val_shard_rows=(6, 6))
    passes = [
        [i for batch in PackedLoader(prepared, "val", 4, r, 2) for i in _ids(batch)]
        for r in range(2)
    ]
    assert passes == [list(range(6)), list(range(6, 12))]
