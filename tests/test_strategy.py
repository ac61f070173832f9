"""The strategy registry (pretrain/strategy.py) and the trainer's callbacks (pretrain/callbacks.py):
a toy strategy added by the recipe of docs/contributing.md (one class, one registry line) is accepted
by the config, planned, and trains on one rank; the callbacks see every step and batch."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from cluster.context import DistContext
from pretrain.callbacks import CallbackError, TrainerCallback, load_callback
from pretrain.config import TrainConfigError, load_config
from pretrain.plan import DEVICES, PlanError, count_parameters, plan_all, plan_memory
from pretrain.strategy import REGISTRY, Strategy, StrategyError, get_strategy, register
from pretrain.trainer import Trainer

# The corpus and train settings of the ``tiny`` fixture (conftest.py).
TINY = dict(docs=40, max_steps=2, grad_accum=2, val_every=100, health_every=100)


class ToyStrategy(Strategy):
    """Weights replicated, the optimizer state sharded over the ranks of a node; it records what
    the trainer asks of it."""

    name = "toy"
    calls: list[str] = []

    def shard_counts(self, nodes: int, gpus_per_node: int) -> tuple[int, int]:
        return 1, gpus_per_node

    def build_optimizer(self, groups, ctx, optimizer_class, **hyper):
        self.calls.append("build_optimizer")
        return super().build_optimizer(groups, ctx, optimizer_class, **hyper)

    def sync_context(self, model, wrapped, ctx, last) -> contextlib.AbstractContextManager:
        self.calls.append(f"sync last={last}")
        return contextlib.nullcontext()

    def after_backward(self, model, params, ctx) -> None:
        self.calls.append("after_backward")


@pytest.fixture
def toy():
    """The toy strategy in the registry for one test (the recipe's registry line is ``register``)."""
    ToyStrategy.calls = []
    register(ToyStrategy)
    yield ToyStrategy
    del REGISTRY[ToyStrategy.name]


class Recorder(TrainerCallback):
    """Every event, in order, with the step counter the trainer had."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.rows = 0
        self.records: list[dict[str, Any]] = []

    def on_run_start(self, trainer: Any) -> None:
        self.events.append(("run_start", trainer.step))

    def on_step_start(self, trainer: Any) -> None:
        self.events.append(("step_start", trainer.step))

    def on_batch(self, trainer: Any, inputs: Any, labels: Any) -> None:
        self.events.append(("batch", trainer.step))
        self.rows += len(inputs)

    def on_step_end(self, trainer: Any, record: dict[str, Any]) -> None:
        self.events.append(("step_end", trainer.step))
        self.records.append(dict(record))

    def on_run_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        self.events.append(("run_end", summary["step"]))


def test_a_registered_strategy_is_accepted_by_the_config_and_planned(toy, tiny):
    _, config_path = tiny
    config = load_config(config_path, ["distributed.strategy=toy"])
    assert config.distributed.strategy == "toy"
    counts = count_parameters(config.model_config())
    plan = plan_memory(config, DEVICES["h100"], 2, 4, counts=counts)
    ddp = plan_memory(config, DEVICES["h100"], 2, 4, "ddp", counts)
    assert plan.strategy == "toy"
    assert plan.row("weights").bytes == ddp.row("weights").bytes == 4 * counts.total
    assert plan.row("optimizer").bytes == -(-8 * counts.total // 4)  # over the 4 ranks of a node
    assert plan.row("optimizer").note == "/ 4 ranks"
    assert "communication buffers" not in [r.name for r in plan.rows]  # the base has none
    assert list(plan_all(config, DEVICES["h100"], 2, 4)) == [
        "ddp",
        "bucketed",
        "fsdp",
        "hsdp",
        "toy",
    ]


def test_an_unknown_strategy_is_refused_by_the_config_and_the_plan(tiny):
    _, config_path = tiny
    with pytest.raises(TrainConfigError, match="choose from ddp, bucketed, fsdp, hsdp$"):
        load_config(config_path, ["distributed.strategy=toy"])
    config = load_config(config_path)
    with pytest.raises(PlanError, match="unknown strategy 'toy'"):
        plan_memory(config, DEVICES["h100"], 1, 8, "toy")
    with pytest.raises(StrategyError, match="do not divide 12 ranks"):
        get_strategy("hsdp", shard_size=8).shard_counts(3, 4)


def test_the_toy_strategy_trains_on_one_rank_and_callbacks_see_each_step(
    toy, tiny, tmp_path, one_thread
):
    _, config_path = tiny
    config = load_config(config_path, ["distributed.strategy=toy"])
    recorder = Recorder()
    trainer = Trainer(config, tmp_path / "run", DistContext(), callbacks=[recorder])
    summary = trainer.run()
    assert summary["step"] == 2 and isinstance(trainer.strategy, ToyStrategy)
    step = ["sync last=False", "sync last=True", "after_backward"]
    assert toy.calls == ["build_optimizer", *step, *step]
    assert recorder.events == [
        ("run_start", 0),
        *[("step_start", 0), ("batch", 0), ("batch", 0), ("step_end", 1)],
        *[("step_start", 1), ("batch", 1), ("batch", 1), ("step_end", 2)],
        ("run_end", 2),
    ]
    assert recorder.rows == 2 * 2 * config.train.micro_batch_size
    assert [r["step"] for r in recorder.records] == [1, 2]
    assert all("val_loss_1" not in r for r in recorder.records)  # seen before validation


def test_a_callback_is_loaded_by_module_and_name():
    assert isinstance(load_callback("test_strategy:Recorder"), Recorder)
    for spec, message in (
        ("Recorder", "expects MODULE:NAME"),
        ("no_such_module:Recorder", "cannot import"),
        ("test_strategy:TINY", "no callable 'TINY'"),
    ):
        with pytest.raises(CallbackError, match=message):
            load_callback(spec)
