"""``train.recurrence_curriculum`` (pretrain/curriculum.py): the scheduled r̄ of each step in both
shapes (the published 1-sqrt one reproduced), refusals in one line, r̄ logged per step with the
depth drawn around it, and ``--plan``'s compute line summing the FLOPs of the steps the run draws."""

from __future__ import annotations

import json
import math

import pytest
from helpers import run_launch

from pretrain.config import TrainConfigError, load_config
from pretrain.curriculum import RecurrenceCurriculum
from pretrain.launch import train
from pretrain.metrics import flops_per_token
from pretrain.plan_compute import compute_plan
from recurrent_model import Depth, sample_depth

# The corpus and train settings of the ``tiny`` fixture (conftest.py): r̄ 4, k 2.
TINY = dict(docs=40, max_steps=6, micro_batch_size=1, val_every=100, health_every=100,
            checkpoint_every=100, tensorboard=False)  # fmt: skip
RAMP = ["train.recurrence_curriculum.shape=linear", "train.recurrence_curriculum.start=1",
        "train.recurrence_curriculum.steps=4"]  # fmt: skip


def published_mean(step: int, warmup_steps: int, target: int) -> int:
    """The fork's scheduled mean recurrence, written from its description (train.py's
    ``sheduler_n_k_handler`` over transformers' warmup_stable_decay with warmup_type 1-sqrt and
    min_lr_ratio 0): the target times 1 − sqrt(1 − step/W) during the warm-up, rounded up, a 0
    raised to 1; the target from W on."""
    factor = 1.0 - math.sqrt(1.0 - step / warmup_steps) if step < warmup_steps else 1.0
    return max(1, math.ceil(target * factor))


def test_linear_goes_from_start_to_target_in_equal_steps():
    ramp = RecurrenceCurriculum("linear", start=1, steps=8, target=9)
    assert [ramp.mean_at(s) for s in range(12)] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9]


def test_one_minus_sqrt_values_and_the_published_schedule():
    ramp = RecurrenceCurriculum("1-sqrt", start=1, steps=4, target=9)
    # 1 + 8 (1 - sqrt(1 - s/4)): 1, 2.07, 3.34, 5, 9
    assert [ramp.mean_at(s) for s in range(6)] == [1, 3, 4, 5, 9, 9]
    published = RecurrenceCurriculum("1-sqrt", start=0, steps=125, target=32)
    assert [published.mean_at(s) for s in range(200)] == [
        published_mean(s, 125, 32) for s in range(200)
    ]
    linear = RecurrenceCurriculum("linear", start=0, steps=125, target=32)
    below = [published.mean_at(s) <= linear.mean_at(s) for s in range(200)]
    assert all(below)  # 1 - sqrt(1 - p) <= p: the published ramp spends less depth early


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        (
            "train.recurrence_curriculum={shape: cosine, steps: 4}",
            "shape='cosine'; choose from linear, 1-sqrt",
        ),
        ("train.recurrence_curriculum.ramp=3", "unknown key(s) train.recurrence_curriculum.ramp"),
        ("train.recurrence_curriculum.start=3", "needs steps"),
        ("train.recurrence_curriculum={steps: 4, start: 9}", "0 <= start <= target"),
        ("train.recurrence_curriculum={steps: 2.5}", "steps=2.5 is not an integer"),
    ],
)
def test_a_bad_curriculum_is_refused_naming_the_key(tiny, setting, says):
    with pytest.raises(TrainConfigError, match="train.recurrence_curriculum") as caught:
        load_config(tiny[1], [setting])
    assert says in str(caught.value)


@pytest.fixture(scope="module")
def ramp_run(tiny):
    """6 steps of the tiny model with r̄ raised linearly 1 -> 4 over 4 steps."""
    root, path = tiny
    config = load_config(path, RAMP)
    assert train(config, root / "ramp") == 0
    records = [json.loads(line) for line in (root / "ramp" / "metrics.jsonl").open()]
    return config, records


def test_the_scheduled_mean_is_logged_each_step_and_the_depth_drawn_around_it(ramp_run):
    config, records = ramp_run
    assert [r["mean_recurrence"] for r in records] == [1, 2, 3, 4, 4, 4]
    for index, record in enumerate(records):
        depth = sample_depth(index, record["mean_recurrence"], config.backprop_depth, seed=0)
        assert (record["depth_no_grad"], record["depth_grad"]) == tuple(depth)


def test_the_plan_sums_the_flops_of_the_steps_the_run_draws(ramp_run, tiny):
    config, records = ramp_run
    plan = compute_plan(config, world=1, device_name="cpu", bf16=False)
    tokens = config.train.micro_batch_size * config.data.block_size
    model, block = config.model_config(), config.data.block_size
    drawn = sum(
        flops_per_token(model, Depth(r["depth_no_grad"], r["depth_grad"]), block) * tokens
        for r in records
    )
    assert plan.flops == pytest.approx(drawn, rel=1e-12)
    assert plan.mean_recurrence == pytest.approx((1 + 2 + 3 + 4 + 4 + 4) / 6)
    without = compute_plan(load_config(tiny[1]), world=1, device_name="cpu", bf16=False)
    assert without.mean_recurrence == 4 and without.flops > plan.flops
    assert plan.seconds_at_peak is None  # no datasheet peak for a CPU
    on_gpu = compute_plan(config, world=2, device_name="h100", bf16=True)
    assert on_gpu.seconds_at_peak == pytest.approx(on_gpu.flops / 2 / 989e12)


def test_launch_plan_prints_the_compute_line(tiny):
    args = ["--config", str(tiny[1]), "--plan", *[a for s in RAMP for a in ("--set", s)]]
    code, out, err = run_launch(*args)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("compute:"))
    assert "over 6 steps x 32 tokens" in line
    assert "r̄ 1 -> 4 over 4 steps (linear curriculum), 3.00 on average" in line
