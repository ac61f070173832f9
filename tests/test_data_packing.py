"""The packer on a hand-made corpus: exact rows, dropped tails, keep-all continuation, shards."""

import hashlib

import numpy as np
import pytest

from pretrain.data.packing import Packer, ShardWriter, pack, row_dtype

BOS, EOS = 100, 101


def test_rows_and_dropped_tails_exact():
    packer = Packer(row_length=5, bos_id=BOS, eos_id=EOS)
    assert list(packer.add([1, 2])) == []  # buffer: BOS 1 2 EOS (4 < 5)
    # BOS 1 2 EOS BOS 3 4 5 EOS: the first 5 form a row, "3 4 5 EOS" is dropped.
    assert list(packer.add([3, 4, 5])) == [[BOS, 1, 2, EOS, BOS]]
    assert packer.buffer == [] and packer.dropped_tokens == 4
    assert list(packer.add([6])) == []
    assert list(packer.add([7, 8])) == [[BOS, 6, EOS, BOS, 7]]
    assert packer.dropped_tokens == 4 + 2
    assert packer.finish() == 0


def test_keep_all_document_continues_into_next_rows():
    packer = Packer(row_length=5, bos_id=BOS, eos_id=EOS)
    assert list(packer.add([6])) == []
    rows = list(packer.add([7, 8, 9, 10, 11, 12], keep_all=True))
    assert rows == [[BOS, 6, EOS, BOS, 7], [8, 9, 10, 11, 12]]
    assert packer.buffer == [EOS] and packer.dropped_tokens == 0
    # A normal document after it: its own tail is dropped again.
    assert list(packer.add([13, 14, 15])) == [[EOS, BOS, 13, 14, 15]]
    assert packer.buffer == [] and packer.dropped_tokens == 1


def test_pack_drops_final_partial_row_and_rows_start_at_documents():
    docs = [(list(range(1, n + 1)), False) for n in (3, 9, 1, 2, 4, 7)]
    rows = list(pack(docs, row_length=6, bos_id=BOS, eos_id=EOS))
    assert rows == [
        [BOS, 1, 2, 3, EOS, BOS],
        [BOS, 1, EOS, BOS, 1, 2],
        [BOS, 1, 2, 3, 4, EOS],
        [BOS, 1, 2, 3, 4, 5],
    ]


def test_packer_rejects_tiny_rows():
    with pytest.raises(ValueError, match="row_length"):
        Packer(row_length=1, bos_id=BOS, eos_id=EOS)


def test_shard_writer_splits_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.setattr("pretrain.data.packing.SHARD_BYTES", 3 * 4 * 2)  # 3 rows of 4 uint16
    writer = ShardWriter(tmp_path, "train", row_length=4, dtype=row_dtype(1000))
    rows = [[i, i + 1, i + 2, i + 3] for i in range(7)]
    for row in rows:
        writer.write(row)
    shards = writer.close()
    assert [s[:2] for s in shards] == [
        ["train-00000.npy", 3],
        ["train-00001.npy", 3],
        ["train-00002.npy", 1],
    ]
    for name, _, size, sha in shards:
        data = (tmp_path / name).read_bytes()
        assert size == len(data) and sha == hashlib.sha256(data).hexdigest()
    stored = np.concatenate([np.load(tmp_path / s[0]) for s in shards])
    assert stored.dtype == np.uint16 and stored.tolist() == rows


def test_row_dtype_widens_above_65536():
    assert row_dtype(65536) == np.uint16 and row_dtype(65537) == np.uint32
