"""Metrics sinks: a tiny training run writes TensorBoard scalars equal to metrics.jsonl; W&B gets
the same numbers when it is installed and a project is configured (a stand-in wandb module here)."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path

import pytest
from helpers import write_config, write_corpus

from pretrain.launch import main as launch_main
from pretrain.metrics import MetricsWriter, scalars, wandb_project


def read_scalars(log_dir: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_tiny_run_writes_the_loss_to_tensorboard(tmp_path):
    write_corpus(tmp_path / "corpus", docs=60)
    config = write_config(
        tmp_path / "tiny.yaml",
        tmp_path / "corpus",
        tmp_path / "data",
        max_steps=3,
        checkpoint_every=3,
        health_every=3,
        val_every=3,
    )
    run = tmp_path / "run"
    assert launch_main(["--config", str(config), "--out", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    loss = read_scalars(run / "tensorboard", "loss")
    assert sorted(loss) == [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert loss[r["step"]] == pytest.approx(r["loss"], rel=1e-6)
    val = read_scalars(run / "tensorboard", "val_loss_1")
    assert val[3] == pytest.approx(rows[-1]["val_loss_1"], rel=1e-6)


class FakeRun:
    def __init__(self, **kwargs):
        self.init = kwargs
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    runs: list[FakeRun] = []

    def init(**kwargs):
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def test_wandb_sink_when_installed_and_configured(tmp_path, monkeypatch, fake_wandb):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert wandb_project() is None  # installed but not configured: off
    monkeypatch.setenv("WANDB_PROJECT", "huginn")
    assert wandb_project() == "huginn" and wandb_project("mine") == "mine"
    writers = []
    for _ in range(2):  # two links of a job chain: the same W&B run id
        w = MetricsWriter(
            tmp_path / "metrics.jsonl",
            tensorboard=False,
            wandb_project=wandb_project(),
            run_config={"train": {"lr": 1e-3}},
        )
        w.write({"step": 5, "loss": 2.5, "note": "text", "skipped": True})
        w.close()
        writers.append(w)
    first, second = fake_wandb
    assert first.init["project"] == "huginn" and first.init["resume"] == "allow"
    assert first.init["id"] == second.init["id"]
    assert first.init["config"] == {"train": {"lr": 1e-3}}
    assert first.logged == [(5, {"loss": 2.5, "skipped": 1.0})] and first.finished
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["note"] == "text"


def test_wandb_off_without_the_package(monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "huginn")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails, as when not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert wandb_project() is None


def test_scalars_keep_numbers_only():
    import torch

    got = scalars({"step": 3, "loss": torch.tensor(1.5), "lr": 1e-3, "name": "x", "ok": False})
    assert got == {"loss": 1.5, "lr": 1e-3, "ok": 0.0}
