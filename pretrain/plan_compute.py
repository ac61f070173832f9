"""The run's training compute for ``launch.py --plan``: the model FLOPs of every step at the depth
the trainer will draw for it (``sample_depth`` at the step's r̄, the recurrence curriculum's where
there is one), and the time that takes at the device's datasheet peak.

The depths are the trainer's own (seeded by ``train.seed`` and the step), so the total is what the
run's metrics add up to, not an average over the sampler; the FLOPs per token are the one cost model
(``config.cost.train_flops_per_token``, pretrain/metrics.py's ``flops_per_token``).
"""

from __future__ import annotations

from dataclasses import dataclass

from recurrent_model import sample_depth

from .config import TrainConfig
from .curriculum import RecurrenceCurriculum, mean_recurrence_at
from .metrics import PEAK_FLOPS_BF16, flops_per_token


@dataclass(frozen=True)
class ComputePlan:
    """Model FLOPs of ``steps`` steps, the r̄ they were drawn around, and the device's peak."""

    steps: int
    tokens_per_step: int
    flops: float
    mean_recurrence: float  # r̄ averaged over the steps
    mean_depth: float  # the drawn depths averaged over the steps
    curriculum: RecurrenceCurriculum | None
    world: int
    peak_flops: float | None  # per device; None: no datasheet figure (the CPU)

    @property
    def seconds_at_peak(self) -> float | None:
        if not self.peak_flops:
            return None
        return self.flops / self.world / self.peak_flops


def compute_plan(
    config: TrainConfig, world: int, device_name: str, bf16: bool, steps: int | None = None
) -> ComputePlan:
    """The compute of ``steps`` steps (default ``train.max_steps``) on ``world`` ranks."""
    model, t = config.model_config(), config.train
    steps = t.max_steps if steps is None else steps
    curriculum = config.curriculum()
    tokens = t.micro_batch_size * t.grad_accum * config.data.block_size * world
    per_token: dict[tuple[int, int], float] = {}
    flops = means = depths = 0.0
    for step in range(steps):
        mean = mean_recurrence_at(curriculum, model.mean_recurrence, step)
        depth = sample_depth(step, mean, config.backprop_depth, seed=t.seed)
        key = (depth.no_grad, depth.grad)
        if key not in per_token:
            per_token[key] = flops_per_token(model, depth, config.data.block_size)
        flops += per_token[key] * tokens
        means += mean
        depths += depth.total
    peak = PEAK_FLOPS_BF16.get(device_name.upper())
    if peak is not None and not bf16:
        peak /= 2
    count = max(steps, 1)
    return ComputePlan(steps, tokens, flops, means / count, depths / count, curriculum, world, peak)


def format_compute(plan: ComputePlan, device_label: str) -> str:
    """One line: total FLOPs, the r̄ schedule and mean depth, and the time at the peak."""
    if plan.curriculum is None:
        schedule = f"r̄ {plan.mean_recurrence:g} throughout"
    else:
        c = plan.curriculum
        schedule = (
            f"r̄ {c.start:g} -> {c.target} over {c.steps} steps ({c.shape} curriculum), "
            f"{plan.mean_recurrence:.2f} on average"
        )
    line = (
        f"compute: {plan.flops:.3e} model FLOPs over {plan.steps} steps x "
        f"{plan.tokens_per_step} tokens ({schedule}; drawn depths {plan.mean_depth:.2f} on "
        "average)"
    )
    seconds = plan.seconds_at_peak
    if seconds is None:
        return line + "; no datasheet peak for this device: no time estimate"
    return line + f"; {seconds / 3600:.3g} h at the {device_label}'s datasheet peak (100% MFU)"
