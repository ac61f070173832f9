"""load_model("org/name") through a hub cache built in the test (offline, no network)."""

from __future__ import annotations

import fnmatch
import os
import shutil

import pytest
import torch

import recurrent_model as rm
from recurrent_model import hub
from recurrent_model.checkpoint import CheckpointError

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(tmp_path, model: rm.RecurrentLM, repo: str = "org/tiny-model"):
    """The hub cache layout: models--org--name/{blobs,refs/main,snapshots/<rev>/...}, as
    huggingface_hub writes it (snapshot files are links into blobs/)."""
    cache = tmp_path / "hub-cache"
    root = cache / ("models--" + repo.replace("/", "--"))
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    snapshot = root / "snapshots" / REVISION
    (root / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(saved.iterdir())):
        blob = root / "blobs" / f"blob{i:02d}"
        shutil.copy(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(REVISION)
    return cache, snapshot


@pytest.fixture
def offline_cache(tmp_path, model, monkeypatch):
    cache, snapshot = _hub_cache(tmp_path, model)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local "org/" folder
    return cache, snapshot


def test_load_model_from_hub_cache_offline(offline_cache, model) -> None:
    loaded = rm.load_model("org/tiny-model")
    assert loaded.name == model.name  # the saved config names it
    ids = torch.randint(
        0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1)
    )
    init = torch.zeros(1, 6, model.config.n_embd)
    want = model(ids, num_steps=3, init_state=init).logits
    got = loaded(ids, num_steps=3, init_state=init).logits
    assert torch.equal(want, got)
    # revision pinned with "@"
    assert hub.download_checkpoint(f"org/tiny-model@{REVISION}") == offline_cache[1]


def test_offline_missing_repo_names_the_problem(offline_cache) -> None:
    with pytest.raises(CheckpointError, match="offline mode") as err:
        rm.load_model("org/not-cached")
    assert "org/not-cached" in str(err.value) and str(offline_cache[0]) in str(err.value)


def test_local_typo_stays_a_local_error(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="does not exist"):
        rm.load_model("checkpoints/typo")


def test_hub_id_shape() -> None:
    for good in ("org/name", "tomg-group-umd/huginn-0125", "a.b/c_d-1", "org/name@main"):
        assert hub.looks_like_hub_id(good), good
    for bad in ("name", "/abs/path", "./org/name", "a/b/c", "../org", "org/", "~/x/y"):
        assert not hub.looks_like_hub_id(bad), bad


def test_online_download_asks_for_safetensors_only(monkeypatch, tmp_path) -> None:
    calls = {}

    def fake_snapshot_download(repo_id, **kwargs):
        calls.update(kwargs, repo_id=repo_id)
        return str(tmp_path)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert hub.download_checkpoint("org/name@v1") == tmp_path
    assert calls["repo_id"] == "org/name" and calls["revision"] == "v1"
    assert calls["local_files_only"] is False and str(calls["cache_dir"]) == str(tmp_path / "c")
    patterns = calls["allow_patterns"]

    def allowed(name: str) -> bool:
        return any(fnmatch.fnmatch(name, p) for p in patterns)

    for name in ("model.safetensors", "model-00001-of-00004.safetensors", "config.json"):
        assert allowed(name), name
    assert allowed("model.safetensors.index.json") and allowed("tokenizer.json")
    for name in ("pytorch_model.bin", "model.pt", "pytorch_model.bin.index.json", "raven.py"):
        assert not allowed(name), name


def test_app_checkpoint_field_takes_a_hub_id(tmp_path, monkeypatch):
    """The app opens a model typed as a hub id, from a cache built here, offline."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from recurrent_model.standin import fallback_model

    model = fallback_model()  # carries a tokenizer, so the app can encode its prompt
    model.config.name = "hub-standin"
    cache, _ = _hub_cache(tmp_path, model, repo="someorg/standin")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    app = str(Path(__file__).resolve().parents[1] / "apps" / "trajectories.py")
    at = AppTest.from_file(app, default_timeout=240).run()
    at.text_input(key="checkpoint").set_value("someorg/standin").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    # "someorg/standin" exists nowhere but in the hub cache: the model came through the hub
    assert any("from `someorg/standin`" in c.value for c in at.caption)
    at.number_input(key="steps").set_value(4)
    at.text_input(key="seeds").set_value("0")
    at.run()
    assert any("4 steps" in c.value and "seeds 0" in c.value for c in at.caption)
