"""Preparation before the job: determinism, workers, mixture weights, manifest checks, the trainer
reading only the manifest, Hugging Face datasets sources and the prepare.py command."""

import json
import random
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import pretrain.data.prepare as prepare_module
import pretrain.data.readers as readers_module
from pretrain.config import DataSection
from pretrain.data import DataConfig, DataError, load_prepared, prepare_data
from pretrain.data.readers import ReadStats, read_jsonl, read_source
from pretrain.trainer import prepare as trainer_prepare
from recurrent_model.tokenizer import HuginnTokenizer

ROOT = Path(__file__).resolve().parent.parent
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _write(path: Path, n: int, tag: str) -> Path:
    rng = np.random.default_rng(len(tag) + n)
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 12))))
            f.write(json.dumps({"text": f"{tag} {i}: {words}."}) + "\n")
    return path


def _config(sources, **overrides) -> DataConfig:
    base = dict(
        sources=[str(s) for s in sources], vocab_size=400, block_size=16, val_fraction=0.1, seed=3
    )
    return DataConfig(**{**base, **overrides})


def _hashes(directory: Path) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text())
    shards = {s: [e[1:] for e in v] for s, v in manifest["prepared"]["shards"].items()}
    return {"tokenizer": manifest["tokenizer_sha256"], "shards": shards}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    _write(root / "a.jsonl", 300, "apple")
    _write(root / "b.jsonl", 100, "banana")
    return root


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("built")
    config = _config([corpus / "a.jsonl", corpus / "b.jsonl"])
    return config, prepare_data(config, out, progress=False)


def test_deterministic_and_two_workers_equal_one(corpus, built, tmp_path, monkeypatch):
    config, first = built
    monkeypatch.setattr(prepare_module, "BATCH_DOCS", 16)  # many batches in flight at once
    again = prepare_data(config, tmp_path / "serial", progress=False, workers=1)
    parallel = prepare_data(config, tmp_path / "parallel", progress=False, workers=2)
    assert _hashes(first.directory) == _hashes(again.directory) == _hashes(parallel.directory)
    assert first.corpus_hash == parallel.corpus_hash
    rows = [np.load(p) for p, _ in parallel.shard_paths("train")]
    assert sum(len(r) for r in rows) == first.train_rows > 50


def test_manifest_records_hashes_and_counts(built):
    config, prepared = built
    manifest = json.loads((prepared.directory / "manifest.json").read_text())
    for entry in manifest["prepared"]["shards"]["train"]:
        path = prepared.directory / entry[0]
        assert entry[2] == path.stat().st_size
        assert entry[3] == prepare_module.file_sha256(path)
    sources = prepared.stats["sources"]
    assert [s["documents_read"] for s in sources.values()] == [300, 100]
    assert [s["documents_emitted"] for s in sources.values()] == [300, 100]
    tokens = prepared.stats["tokens"]
    emitted = sum(s["tokens_emitted"] for s in sources.values())
    assert emitted == tokens["train"]["tokens"] + tokens["val"]["tokens"]


def test_mixture_weights(corpus, built, tmp_path):
    a, b = str(corpus / "a.jsonl"), str(corpus / "b.jsonl")
    config = _config([a, b], weights={a: 0.5, b: 2.0})
    prepared = prepare_data(config, tmp_path, progress=False)
    sources = prepared.stats["sources"]
    assert sources[b]["documents_emitted"] == 200  # every banana document twice
    # each apple document is kept with probability 0.5, drawn from the documented per-source seed
    rng = random.Random(f"mix:{config.seed}:{a}")
    assert sources[a]["documents_emitted"] == sum(rng.random() < 0.5 for _ in range(300))
    assert 110 < sources[a]["documents_emitted"] < 190
    unweighted = built[1].stats["sources"]
    share = sources[b]["tokens_emitted"] / (
        sources[a]["tokens_emitted"] + sources[b]["tokens_emitted"]
    )
    before = unweighted[b]["tokens_emitted"] / sum(s["tokens_emitted"] for s in unweighted.values())
    assert share == pytest.approx(before * 2 / (before * 2 + (1 - before) * 0.5), rel=0.15)
    dropped = prepare_data(_config([a, b], weights={a: 0.0}), tmp_path / "no-a", progress=False)
    tok = HuginnTokenizer.from_file(dropped.tokenizer_path)
    rows = np.concatenate([np.load(p) for p, _ in dropped.shard_paths("train")])
    text = " ".join(tok.decode(r.tolist()) for r in rows[:40])
    assert "banana" in text and "apple" not in text
    assert dropped.stats["sources"][a]["documents_emitted"] == 0


@pytest.mark.parametrize(
    ("weights", "message"),
    [({"elsewhere": 1.0}, "not in sources"), ({"A": -1.0}, ">= 0"), ({"A": 0.0}, "every source")],
)
def test_weight_errors(weights, message):
    config = _config(["A"], weights=weights)
    with pytest.raises(DataError, match=message):
        config.validate()


def _copy(prepared, tmp_path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(prepared.directory, target)
    return target


def test_missing_or_corrupted_manifest_is_a_clear_error(built, tmp_path):
    config, prepared = built
    directory = _copy(prepared, tmp_path)
    assert load_prepared(directory, config, verify=True).train_rows == prepared.train_rows
    manifest = directory / "manifest.json"
    text = manifest.read_text()

    manifest.write_text(text[: len(text) // 2])
    with pytest.raises(DataError, match="manifest.json is corrupted.*pretrain/prepare.py"):
        load_prepared(directory)
    broken = json.loads(text)
    del broken["prepared"]["shards"]
    manifest.write_text(json.dumps(broken))
    with pytest.raises(DataError, match="corrupted"):
        load_prepared(directory)
    manifest.write_text(text)
    with pytest.raises(DataError, match="another data config .*block_size"):
        load_prepared(directory, _config(config.sources, block_size=32))

    shard = directory / json.loads(text)["prepared"]["shards"]["train"][0][0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, other content: only verify notices
    shard.write_bytes(bytes(data))
    load_prepared(directory, config)
    with pytest.raises(DataError, match="does not match its SHA-256"):
        load_prepared(directory, config, verify=True)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(DataError, match="the manifest says"):
        load_prepared(directory, config)
    shard.unlink()
    with pytest.raises(DataError, match="is missing"):
        load_prepared(directory, config)
    manifest.unlink()
    with pytest.raises(DataError, match="manifest.json missing"):
        load_prepared(directory, config)


def test_prepare_rebuilds_over_a_corrupted_manifest(built, tmp_path):
    config, prepared = built
    directory = _copy(prepared, tmp_path)
    (directory / "manifest.json").write_text("{not json")
    rebuilt = prepare_data(config, directory, progress=False)
    assert _hashes(directory) == _hashes(prepared.directory)
    assert rebuilt.train_rows == prepared.train_rows


class _Rank:
    is_main = True

    def barrier(self) -> None:
        pass


def _train_config(config: DataConfig, directory: Path, prepare_in_job: bool):
    data = {**asdict(config), "cache_dir": str(directory), "prepare_in_job": prepare_in_job}
    return SimpleNamespace(data=DataSection(**data))


@pytest.mark.parametrize("prepare_in_job", [True, False])
def test_trainer_does_not_read_or_hash_the_corpus(built, tmp_path, monkeypatch, prepare_in_job):
    config, prepared = built
    directory = _copy(prepared, tmp_path)

    def forbidden(*args, **kwargs):
        raise AssertionError("the training job read or hashed the corpus")

    monkeypatch.setattr(prepare_module, "hash_document", forbidden)
    monkeypatch.setattr(prepare_module.Corpus, "documents", forbidden)
    monkeypatch.setattr(prepare_module, "read_source", forbidden)
    monkeypatch.setattr(readers_module, "_read_bytes", forbidden)
    train_config = _train_config(config, directory, prepare_in_job)
    opened = trainer_prepare(train_config, directory, _Rank(), progress=False)
    assert opened.shards == prepared.shards and opened.directory == directory


def test_cluster_config_without_prepared_data_fails_fast(tmp_path, built):
    config, prepared = built
    train_config = _train_config(config, tmp_path / "none", prepare_in_job=False)
    with pytest.raises(DataError, match="manifest.json missing.*pretrain/prepare.py"):
        trainer_prepare(train_config, tmp_path / "none", _Rank(), progress=False)
    assert not (tmp_path / "none").exists()


def test_launch_of_the_frontier_config_names_prepare_py(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "pretrain/launch.py",
            "--config",
            "pretrain/configs/huginn-3.5b-frontier.yaml",
            "--set",
            "train.device=cpu",
            "--set",
            "distributed.strategy=ddp",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "pretrain/prepare.py" in proc.stderr and "Traceback" not in proc.stderr


def test_jsonl_is_streamed_line_by_line(tmp_path, monkeypatch):
    path = _write(tmp_path / "c.jsonl", 5, "x")
    monkeypatch.setattr(readers_module, "_read_bytes", lambda p: pytest.fail("read whole file"))
    docs = list(read_jsonl(path, "c", "replace", ReadStats()))
    assert [d.text.split(":")[0] for d in docs] == [f"x {i}" for i in range(5)]


def test_prepare_command(corpus, tmp_path):
    from pretrain.prepare import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "data:\n"
        f"  sources: [{corpus / 'b.jsonl'}]\n"
        "  vocab_size: 400\n  block_size: 16\n  val_fraction: 0.1\n"
        "  prepare_in_job: false\n"
        "train:\n  progress: false\n"
    )
    out = tmp_path / "run"
    args = ["--config", str(cfg), "--out", str(out)]
    assert main([*args, "--check"]) == 1
    assert main([*args, "--workers", "1"]) == 0
    assert (out / "data" / "manifest.json").is_file()
    assert main([*args, "--check"]) == 0
    assert main([*args, "--verify"]) == 0
    assert main([*args, "--set", "data.block_size=8", "--check"]) == 1
    assert main([*args, "--workers", "0"]) == 2


# Hugging Face datasets (local, offline) ----------------------------------------------------------
def test_hf_dataset_sources(corpus, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    expected = [d.text for d in read_source(str(corpus / "b.jsonl"), 0, "replace", ReadStats())]

    single = tmp_path / "single"
    datasets.Dataset.from_dict({"text": expected, "id": list(range(len(expected)))}).save_to_disk(
        single
    )
    both = tmp_path / "both"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": expected}),
            "test": datasets.Dataset.from_dict({"text": ["held out"]}),
        }
    ).save_to_disk(both)

    def texts(source):
        return [d.text for d in read_source(source, 0, "replace", ReadStats())]

    assert texts(f"hf:{single}") == expected
    assert texts(f"hf:{both}") == expected  # "train" by default
    assert texts(f"hf:{both}@test") == ["held out"]
    assert texts(f"hf:{corpus / 'b.jsonl'}") == expected  # local files through load_dataset
    with pytest.raises(DataError, match="does not exist"):
        texts(f"hf:{tmp_path / 'missing'}")
    with pytest.raises(DataError, match="not a datasets save_to_disk directory"):
        texts(f"hf:{corpus}")

    from_hf = prepare_data(_config([f"hf:{single}"]), tmp_path / "p-hf", progress=False)
    from_jsonl = prepare_data(_config([corpus / "b.jsonl"]), tmp_path / "p-j", progress=False)
    assert from_hf.train_rows == from_jsonl.train_rows > 0
    assert _hashes(from_hf.directory)["shards"] == _hashes(from_jsonl.directory)["shards"]


def test_open_file_limit_is_raised_for_many_shards(monkeypatch):
    import resource

    from pretrain.data.loader import FD_MARGIN, raise_open_file_limit

    limits = {"soft": 1024, "hard": 4096}
    calls = []

    def setrlimit(which, values):
        calls.append(values)
        limits["soft"] = values[0]

    monkeypatch.setattr(resource, "getrlimit", lambda which: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert raise_open_file_limit(100) == 1024 and calls == []  # enough already
    assert raise_open_file_limit(2000) == 2000 + FD_MARGIN
    assert raise_open_file_limit(10_000) == 4096  # capped by the hard limit
    assert calls == [(2000 + FD_MARGIN, 4096), (4096, 4096)]
