"""prepare_data end to end on a small corpus, and PackedLoader determinism, resume and ranks."""

import json

import numpy as np
import pytest
import torch

import pretrain.data.prepare as prepare_module
from pretrain.data import DataConfig, DataError, PackedLoader, load_prepared, prepare_data
from pretrain.data.readers import Document
from recurrent_model.tokenizer import HuginnTokenizer

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _write_corpus(path, n=400):
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12))))
            f.write(json.dumps({"text": f"doc {i}: {words}."}) + "\n")


def _config(source, **overrides):
    base = dict(sources=[str(source)], vocab_size=400, block_size=16, val_fraction=0.1, seed=3)
    return DataConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    _write_corpus(root / "corpus.jsonl")
    return prepare_data(_config(root / "corpus.jsonl"), root / "out", progress=False)


def _rows(batches):
    return [tuple(x[i].tolist() + [y[i, -1].item()]) for x, y in batches for i in range(len(x))]


def test_prepared_rows_start_with_whole_documents(prepared):
    tok = HuginnTokenizer.from_file(prepared.tokenizer_path)
    assert prepared.train_rows > 50 and prepared.val_rows > 0
    shards = [np.load(p) for p, _ in prepared.shard_paths("train")]
    rows = np.concatenate(shards)
    assert rows.shape == (prepared.train_rows, 17)
    assert (rows[:, 0] == tok.bos_id).all()  # no keep-all source: every row starts a document
    text = tok.decode(rows[0].tolist())
    assert text.startswith("<|begin_text|>doc ")
    assert prepared.stats["docs_per_source"] == {prepared_source(prepared): 400}
    assert load_prepared(prepared.directory) == prepared


def prepared_source(prepared):
    return next(iter(prepared.stats["docs_per_source"]))


def test_batches_shift_labels_by_one(prepared):
    inputs, labels = next(iter(PackedLoader(prepared, "train", batch_size=4)))
    assert inputs.shape == labels.shape == (4, 16) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], labels[:, :-1])


def test_train_loader_is_deterministic_and_seeded(prepared):
    a = [next(PackedLoader(prepared, "train", 4, seed=1)) for _ in range(1)]
    b = [next(PackedLoader(prepared, "train", 4, seed=1)) for _ in range(1)]
    c = [next(PackedLoader(prepared, "train", 4, seed=2)) for _ in range(1)]
    assert _rows(a) == _rows(b) and _rows(a) != _rows(c)


def test_each_epoch_visits_every_row_once_in_a_new_order(prepared):
    loader = PackedLoader(prepared, "train", batch_size=1)
    n = prepared.train_rows
    epoch0 = _rows(next(loader) for _ in range(n))
    epoch1 = _rows(next(loader) for _ in range(n))
    assert len(set(epoch0)) == n and sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1


def test_resume_yields_exactly_the_next_batches(prepared):
    batch = 7  # does not divide the row count: batches straddle epochs
    loader = PackedLoader(prepared, "train", batch, seed=5)
    steps = prepared.train_rows // batch + 3  # past the first epoch boundary
    for _ in range(steps):
        next(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = _rows(next(loader) for _ in range(5))
    resumed = PackedLoader(prepared, "train", batch, seed=5)
    resumed.load_state_dict(state)
    assert state["dealer"]["cursor"] > prepared.train_rows  # into the second round
    assert _rows(next(resumed) for _ in range(5)) == expected


def test_ranks_get_disjoint_rows(prepared):
    per_rank = prepared.train_rows // 2  # one lane each: a contiguous half of the epoch
    seen = []
    for rank in range(2):
        loader = PackedLoader(prepared, "train", batch_size=1, rank=rank, world_size=2)
        seen.append(set(_rows(next(loader) for _ in range(per_rank))))
        assert len(seen[-1]) == per_rank
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 2 * per_rank


def test_val_is_one_pass_then_stops(prepared):
    loader = PackedLoader(prepared, "val", batch_size=3)
    batches = list(loader)
    assert sum(len(x) for x, _ in batches) == prepared.val_rows == len(set(_rows(batches)))
    assert len(batches) == len(loader)
    with pytest.raises(StopIteration):
        next(loader)
    assert _rows(list(loader)) == _rows(batches)  # iterating again starts a fresh pass


def test_state_for_another_split_or_seed_is_rejected(prepared):
    state = PackedLoader(prepared, "train", 4, rank=0, world_size=2, seed=1).state_dict()
    with pytest.raises(DataError, match="seed"):
        PackedLoader(prepared, "train", 4).load_state_dict(state)
    state["version"] = 1
    with pytest.raises(DataError, match="version 1"):
        PackedLoader(prepared, "train", 4, seed=1).load_state_dict(state)


def test_loader_argument_errors(prepared):
    with pytest.raises(DataError, match="split"):
        PackedLoader(prepared, "test", 4)
    with pytest.raises(DataError, match="rank 2"):
        PackedLoader(prepared, "train", 4, rank=2, world_size=2)
    with pytest.raises(DataError, match="fewer than batch_size"):
        PackedLoader(prepared, "train", prepared.train_rows + 1)


def test_second_call_reuses_the_build(prepared, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("rebuilt instead of reusing")

    monkeypatch.setattr(prepare_module, "_pack_splits", fail)
    source = prepared_source(prepared)
    again = prepare_data(_config(source), prepared.directory, progress=False)
    assert again == prepared


def test_failed_rebuild_leaves_the_previous_data_intact(prepared, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(prepare_module, "_pack_splits", crash)
    with pytest.raises(RuntimeError, match="killed"):
        prepare_data(
            _config(prepared_source(prepared), block_size=8), prepared.directory, progress=False
        )
    assert load_prepared(prepared.directory) == prepared
    assert not list(prepared.directory.glob(".tmp-*"))


def test_reusing_a_tokenizer_and_keep_all(prepared, tmp_path):
    source = prepared_source(prepared)
    config = _config(
        source,
        tokenizer_path=str(prepared.tokenizer_path),
        keep_all_sources=[source],
        block_size=32,
    )
    other = prepare_data(config, tmp_path, progress=False)
    assert other.tokenizer_path.read_bytes() == prepared.tokenizer_path.read_bytes()
    tok = HuginnTokenizer.from_file(other.tokenizer_path)
    rows = np.concatenate([np.load(p) for p, _ in other.shard_paths("train")])
    assert (rows[:, 0] != tok.bos_id).any()  # keep-all rows continue mid-document
    assert other.stats["tokens"]["train"]["tokens_dropped"] < 33  # only the last partial row


def test_tokenizer_with_another_vocab_size_is_rejected(prepared, tmp_path):
    config = _config(
        prepared_source(prepared), tokenizer_path=str(prepared.tokenizer_path), vocab_size=512
    )
    with pytest.raises(DataError, match="expected vocab_size 512"):
        prepare_data(config, tmp_path, progress=False)


def test_invalid_utf8_is_counted_in_prepared_stats(tmp_path, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(60):
        (corpus / f"{i}.txt").write_text(f"file {i}: " + " ".join(WORDS[: i % 12 + 1]))
    (corpus / "bad.txt").write_bytes(b"bad \xff\xfe bytes " * 5)
    prepared = prepare_data(_config(corpus, val_fraction=0.0), tmp_path / "o", progress=False)
    assert prepared.stats["invalid_utf8_files"] == 1
    assert prepared.stats["invalid_utf8_bytes_replaced"] == 10
    assert "invalid UTF-8 in 1 file(s): 10 byte(s) replaced" in caplog.text


def test_corpus_too_small_for_a_row(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(DataError, match="no training row"):
        prepare_data(
            _config(tmp_path / "c.jsonl", val_fraction=0.0), tmp_path / "o", progress=False
        )


def test_load_prepared_without_manifest(tmp_path):
    with pytest.raises(DataError, match="manifest.json missing.*pretrain/prepare.py"):
        load_prepared(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 200}, "vocab_size 200 is too small"),
        ({"block_size": 0}, "block_size must be positive"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"starter_size": "huge"}, "starter_size"),
        ({"invalid_utf8": "ignore"}, "invalid_utf8"),
        ({"keep_all_sources": ["elsewhere"]}, "not in sources"),
        ({"sources": []}, "sources is empty"),
    ],
)
def test_config_errors(tmp_path, overrides, message):
    with pytest.raises(DataError, match=message):
        prepare_data(_config(tmp_path, **overrides), tmp_path / "o", progress=False)


def test_keep_all_by_kind():
    config = DataConfig(keep_all_sources=["starter:stdlib"])
    config.validate()
    corpus = prepare_module.Corpus(config)
    assert corpus.is_keep_all(Document("x = 1", "starter", "stdlib"))
    assert not corpus.is_keep_all(Document("1 + 1 = 2", "starter", "arithmetic"))
