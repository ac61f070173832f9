"""Readers: directories, JSONL, parquet; invalid UTF-8 counted; unreadable and empty corpora."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretrain.data.config import DataConfig, DataError
from pretrain.data.prepare import Corpus
from pretrain.data.readers import ReadStats, decode_utf8, read_source


def _read(source, policy="replace", seed=0):
    stats = ReadStats()
    return list(read_source(str(source), seed, policy, stats)), stats


def test_decode_utf8_counts_each_bad_byte():
    assert decode_utf8("héllo".encode()) == ("héllo", 0)
    text, bad = decode_utf8(b"ok \xff\xfe end \xc3")
    assert text == "ok \ufffd\ufffd end \ufffd" and bad == 3


def test_directory_reader_replaces_invalid_utf8_and_skips_binary(tmp_path):
    (tmp_path / "a.py").write_text("print('a')\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_bytes(b"caf\xe9 au lait\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / ".hidden").write_text("secret")
    docs, stats = _read(tmp_path)
    assert sorted(d.text for d in docs) == ["caf\ufffd au lait\n", "print('a')\n"]
    assert {d.kind for d in docs} == {"py", "txt"}
    assert stats.invalid_utf8_files == 1 and stats.invalid_utf8_bytes_replaced == 1
    assert stats.binary_files_skipped == 1


def test_skip_policy_skips_and_counts(tmp_path):
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xff")
    docs, stats = _read(tmp_path, policy="skip")
    assert [d.text for d in docs] == ["fine"]
    assert stats.invalid_utf8_skipped == 1 and stats.invalid_utf8_bytes_replaced == 0


def test_directory_order_is_a_seeded_shuffle(tmp_path):
    for i in range(12):
        (tmp_path / f"{i:02d}.txt").write_text(str(i))
    first = [d.text for d in _read(tmp_path, seed=1)[0]]
    assert first == [d.text for d in _read(tmp_path, seed=1)[0]]
    assert first != [d.text for d in _read(tmp_path, seed=2)[0]]
    assert sorted(first, key=int) == [str(i) for i in range(12)]


def test_jsonl_reader(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": "one", "id": 1}).encode(), b"", b'{"text": "tw\xffo"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    docs, stats = _read(path)
    assert [d.text for d in docs] == ["one", "tw\ufffdo"]
    assert stats.invalid_utf8_files == 1 and stats.invalid_utf8_bytes_replaced == 1


def test_jsonl_lone_surrogates_are_replaced(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a\\ud800b"}\n{"text": "fine"}\n')
    docs, stats = _read(path)
    assert [d.text for d in docs] == ["a\ufffdb", "fine"]
    assert stats.invalid_utf8_bytes_replaced == 1
    docs, stats = _read(path, policy="skip")
    assert [d.text for d in docs] == ["fine"] and stats.invalid_utf8_skipped == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"text": "ok"}\n{broken\n', r"docs.jsonl:2: not valid JSON"),
        (b'{"body": "no text"}\n', r"docs.jsonl:1: expected an object"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, content, message):
    (tmp_path / "docs.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=message):
        _read(tmp_path / "docs.jsonl")


def test_parquet_reader_string_and_binary_columns(tmp_path):
    pq.write_table(
        pa.table({"text": ["alpha", None, "beta"], "n": [1, 2, 3]}), tmp_path / "s.parquet"
    )
    docs, _ = _read(tmp_path / "s.parquet")
    assert [d.text for d in docs] == ["alpha", "beta"]
    pq.write_table(
        pa.table({"text": pa.array([b"gamma", b"bad\xff"], pa.binary())}), tmp_path / "b.parquet"
    )
    docs, stats = _read(tmp_path / "b.parquet")
    assert [d.text for d in docs] == ["gamma", "bad\ufffd"]
    assert stats.invalid_utf8_bytes_replaced == 1


def test_directory_of_jsonl_and_parquet_shards(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "from jsonl"}) + "\n")
    pq.write_table(pa.table({"text": ["from parquet"]}), tmp_path / "b.parquet")
    docs, _ = _read(tmp_path)
    assert sorted((d.text, d.kind) for d in docs) == [
        ("from jsonl", "jsonl"),
        ("from parquet", "parquet"),
    ]


def test_parquet_without_text_column_is_an_error(tmp_path):
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet has no 'text' column"):
        _read(tmp_path / "c.parquet")


def test_parquet_string_column_with_invalid_utf8_is_counted(tmp_path):
    raw = pa.array([b"ok", b"bad\xff"], pa.binary())
    unvalidated = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())
    pq.write_table(pa.table({"text": unvalidated}), tmp_path / "u.parquet")
    docs, stats = _read(tmp_path / "u.parquet")
    assert [d.text for d in docs] == ["ok", "bad\ufffd"]
    assert stats.invalid_utf8_files == 1 and stats.invalid_utf8_bytes_replaced == 1


def test_parquet_text_column_of_another_type_is_an_error(tmp_path):
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n\.parquet: the 'text' column has type int64"):
        _read(tmp_path / "n.parquet")


def test_corrupt_parquet_names_the_file(tmp_path):
    (tmp_path / "broken.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(DataError, match=r"broken\.parquet"):
        _read(tmp_path / "broken.parquet")


def test_unreadable_file_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "ok.txt").write_text("fine")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    real = Path.read_bytes

    def read_bytes(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(
        DataError, match=r"cannot read corpus file .*locked\.txt: Permission denied"
    ):
        _read(tmp_path)


def test_missing_source_is_an_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        _read(tmp_path / "nope")


@pytest.mark.parametrize("make", ["empty_dir", "empty_files"])
def test_empty_corpus_is_an_error(tmp_path, make):
    if make == "empty_files":
        (tmp_path / "a.txt").write_text("")
        (tmp_path / "b.txt").write_text("")
    corpus = Corpus(DataConfig(sources=[str(tmp_path)]))
    with pytest.raises(DataError, match="has no documents: the corpus is empty"):
        list(corpus.documents())
