"""The recurrence curriculum: the mean r̄ the depth sampler draws around, raised from a start to the
target over the first steps of a run (``train.recurrence_curriculum``).

    r̄(s) = max(1, ceil(start + (target − start) · f(min(s / steps, 1))))

for the run's step index s (the number of updates made before the step), with

    linear   f(p) = p
    1-sqrt   f(p) = 1 − sqrt(1 − p)

``1-sqrt`` is the shape McLeish et al. 2025 ("Teaching Pretrained Language Models to Think Deeper
with Retrofitted Recurrence", arXiv 2511.07384) train with: their ``train.py``
(LoopedLMs/retrofitting-recurrence @23377b98, ``mean_recurrence_schedule`` and
``sheduler_n_k_handler``) runs Hugging Face's ``warmup_stable_decay`` scheduler with
``warmup_type="1-sqrt"``, ``min_lr_ratio=0`` and the target as its peak, rounds its value up and
raises a 0 to 1; ``paper_plots/scheduling_options.py`` plots it against ``linear``. With ``start: 0``
this module computes exactly their values (their warm-up length is ``ceil(warmup · max_steps)``;
here ``steps`` is given directly). The depth of each step is then drawn around r̄(s) as without a
curriculum (recurrent_model/depth.py), so every rank draws the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SHAPES = ("linear", "1-sqrt")
KEYS = ("shape", "start", "steps", "target")


class CurriculumError(ValueError):
    """A ``train.recurrence_curriculum`` that cannot be used; the message names the key."""


@dataclass(frozen=True)
class RecurrenceCurriculum:
    """r̄ from ``start`` to ``target`` over ``steps`` steps in ``shape``, then ``target``."""

    shape: str
    start: float
    steps: int
    target: int

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise CurriculumError(
                f"train.recurrence_curriculum.shape={self.shape!r}; choose from {', '.join(SHAPES)}"
            )
        if self.steps < 1 or self.target < 1 or not 0 <= self.start <= self.target:
            raise CurriculumError(
                "train.recurrence_curriculum needs steps >= 1, target >= 1 and 0 <= start <= "
                f"target; got steps={self.steps}, start={self.start}, target={self.target}"
            )

    def fraction(self, progress: float) -> float:
        """f(p) of the shape, p in [0, 1]."""
        return progress if self.shape == "linear" else 1.0 - math.sqrt(1.0 - progress)

    def mean_at(self, step: int) -> int:
        """r̄ of the step with index ``step`` (0 for the run's first)."""
        progress = min(max(step, 0) / self.steps, 1.0)
        value = self.start + (self.target - self.start) * self.fraction(progress)
        return max(1, math.ceil(value))


def curriculum_from(raw: dict[str, Any] | None, model_mean: int) -> RecurrenceCurriculum | None:
    """The curriculum of a ``train.recurrence_curriculum`` mapping (None: none); ``target``
    defaults to the model's mean recurrence, ``start`` to 1, ``shape`` to 1-sqrt."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CurriculumError(
            f"train.recurrence_curriculum must be a mapping of {', '.join(KEYS)}, got {raw!r}"
        )
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise CurriculumError(
            f"unknown key(s) train.recurrence_curriculum.{', '.join(unknown)}; it takes "
            f"{', '.join(KEYS)}"
        )
    if "steps" not in raw:
        raise CurriculumError("train.recurrence_curriculum needs steps (the length of the ramp)")
    try:
        return RecurrenceCurriculum(
            shape=str(raw.get("shape", "1-sqrt")),
            start=float(raw.get("start", 1)),
            steps=_integer(raw["steps"], "steps"),
            target=_integer(raw.get("target", model_mean), "target"),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, CurriculumError):
            raise
        raise CurriculumError(f"train.recurrence_curriculum: {exc}") from None


def _integer(value: Any, key: str) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise CurriculumError(f"train.recurrence_curriculum.{key}={value!r} is not an integer")
    return int(value)


def mean_recurrence_at(curriculum: RecurrenceCurriculum | None, model_mean: int, step: int) -> int:
    """The r̄ the depth of the step with index ``step`` is drawn around: the curriculum's, or the
    model's mean recurrence without one."""
    return model_mean if curriculum is None else curriculum.mean_at(step)
