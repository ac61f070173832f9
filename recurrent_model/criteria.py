"""Every adaptive-exit and freeze criterion in one registry, each with its guarded computation.

Greedy generation (``sampling.ExitCriterion``) stops a token's iterations, and the diffusion sampler
(``diffusion``) freezes a wave position, when a criterion passes its threshold. The command line
and the app take their choices from here. A :class:`Criterion` names what it reads and its default
threshold and carries ``start``: a factory of a fresh *judge* for one run (one token of
``generate``, one call of the sampler). A judge maps a :class:`Step` to one value per row of a
batch or per wave position; a judge that needs history (the previous distribution, a count) keeps
it itself. Add a criterion with a line in ``_BUILT_IN`` or with :func:`register`
(``docs/contributing.md``: "Add an exit criterion").

The state criteria are relative norms, ‖Δ‖/‖s‖, with their edge cases decided once:

- ‖s‖ = 0 and ‖Δ‖ = 0 (a zero state that did not move) gives 0: converged;
- ‖s‖ = 0 and ‖Δ‖ > 0 gives +inf: not converged;
- a NaN anywhere gives NaN, and :meth:`Criterion.converged` turns a NaN value into a
  :class:`NonFiniteState` error instead of a position that silently never exits or freezes.

Importing this module imports no torch (the command line reads the names before torch is
imported); the computations take and return tensors.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

__all__ = [
    "CRITERIA",
    "Criterion",
    "Judge",
    "NonFiniteState",
    "Step",
    "WaveView",
    "check_judged",
    "cosine_distance",
    "freeze_strategies",
    "latent_diff",
    "minp_log_probs",
    "names",
    "on_states",
    "register",
    "relative_norm",
    "successive",
]

#: The freeze strategy of the diffusion sampler that is a schedule, not a criterion.
FIXED = "fixed"


class NonFiniteState(FloatingPointError):
    """A criterion met a NaN: the latent state or the logits are not finite."""


@dataclass(frozen=True)
class WaveView:
    """The diffusion sampler's wave for a criterion that looks beyond the aligned positions.

    states: (1, W, h) this step's wave from position ``start``; previous: last step's wave, which
    the sampler indexes from ``previous_start``; stability: (L,) sampler steps each position's guess
    stayed unchanged.
    """

    states: torch.Tensor
    previous: torch.Tensor
    start: int
    previous_start: int
    stability: torch.Tensor


@dataclass(frozen=True)
class Step:
    """What a judge sees after one step.

    now, before: this step's and the previous step's states (..., h) at the same rows (generate:
    (B, h) float32) or wave positions (diffusion: (1, n, h)); None for a diffusion criterion that
    needs logits, which judges the guesses through ``wave.stability``. logits: (B, V) in generate
    for a criterion with ``needs_logits``, else None. wave: the sampler's wave, None in generate.
    gate: (B,) this step's exit probability λ_i of a family with a learned exit gate (Ouro).
    """

    now: torch.Tensor | None
    before: torch.Tensor | None
    logits: torch.Tensor | None = None
    wave: WaveView | None = None
    gate: torch.Tensor | None = None


class Judge(Protocol):
    """One run's criterion: a value per row or position, from one :class:`Step` after another."""

    def __call__(self, step: Step) -> torch.Tensor: ...


@dataclass(frozen=True)
class Criterion:
    """One exit or freeze criterion: what it reads, its default threshold, where it is used and
    how it is computed.

    ``used_by``: "generate" (``exit_criterion``) and/or "diffusion" (``freeze_strategy``); in the
    sampler a state criterion judges the wave positions against ``exit_t`` and one that needs
    logits judges the guesses' stability against num_steps // inner_recurrence. ``start()`` returns
    a fresh :class:`Judge`; ``passes(value, threshold)`` says where the value has converged
    (default: value < threshold).
    """

    name: str
    needs_logits: bool
    default_threshold: float | None  # None: the sampler sets the horizon (token-stability)
    used_by: tuple[str, ...]
    meaning: str
    start: Callable[[], Judge]
    passes: Callable[[torch.Tensor, float], torch.Tensor] = operator.lt
    needs_gate: bool = False  # reads a learned exit gate: only families that have one

    def converged(self, value: torch.Tensor, threshold: float) -> torch.Tensor:
        """Boolean per row or position; a NaN value raises :class:`NonFiniteState`."""
        return self.passes(check_judged(value, self.name), threshold)


def on_states(compute: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[], Judge]:
    """The ``start`` of a criterion of the states alone: ``compute(now, before)`` per step."""

    def judge(step: Step) -> torch.Tensor:
        if step.now is None or step.before is None:
            raise ValueError("a state criterion was given a step without states")
        return compute(step.now, step.before)

    return lambda: judge


# State computations ------------------------------------------------------------------------------
def relative_norm(num: torch.Tensor, ref: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """‖num‖ / ‖ref‖ over the last axis; 0/0 → 0, x/0 → inf, NaN stays NaN.

    ``eps`` > 0 divides by ‖ref‖ + eps instead (the published latent-acceleration-2 formula).
    """
    top, bottom = num.norm(dim=-1), ref.norm(dim=-1)
    if eps > 0:
        return top / (bottom + eps)
    zero = bottom == 0
    ratio = top / bottom.masked_fill(zero, 1.0)
    at_zero = (top * 0).masked_fill(top > 0, float("inf"))
    return ratio.where(~zero, at_zero)


def latent_diff(state: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """‖s − s_prev‖ / ‖s‖ per row of the last axis, guarded (see :func:`relative_norm`)."""
    return relative_norm(state - prev, state)


def cosine_distance(state: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """1 − cos(s, s_prev); two zero states did not move (0), one zero state did (1)."""
    from torch.nn.functional import cosine_similarity

    value = 1 - cosine_similarity(state, prev, dim=-1)
    both_zero = (state.norm(dim=-1) == 0) & (prev.norm(dim=-1) == 0)
    return value.masked_fill(both_zero, 0.0)


class _Acceleration1:
    """‖Δ_i − Δ_{i−1}‖ / ‖s_i‖ with Δ = now − before; Δ_{i−1} is the last call's Δ by wave offset
    (zero before the first), over the positions both cover."""

    def __init__(self) -> None:
        self.previous_delta: torch.Tensor | None = None

    def __call__(self, step: Step) -> torch.Tensor:
        assert step.now is not None and step.before is not None
        delta = step.now - step.before
        last = self.previous_delta
        m = delta.shape[1] if last is None else min(delta.shape[1], last.shape[1])
        accel = delta[:, :m] if last is None else delta[:, :m] - last[:, :m]
        self.previous_delta = delta.clone()
        return relative_norm(accel, step.now[:, :m])


class _Acceleration2:
    """‖(s_i − s_{i−1}) − (s_{i−1} − s_{i−2})‖ / (‖s_i‖ + 1e-6) over the positions present in the
    sampler's last three waves (the one before the first step is zero; no common position, no
    value)."""

    def __init__(self) -> None:
        self.earlier: torch.Tensor | None = None
        self.earlier_start = 0

    def __call__(self, step: Step) -> torch.Tensor:
        wave = step.wave
        assert wave is not None
        if self.earlier is None:
            self.earlier, self.earlier_start = wave.previous.new_zeros(wave.previous.shape), 0
        index, old, older = wave.start, wave.previous_start, self.earlier_start
        lo = max(index, old, older)
        hi = min(index + wave.states.shape[1], old + wave.previous.shape[1],
                 older + self.earlier.shape[1])  # fmt: skip
        hi = max(hi, lo)  # no position in all three waves: nothing to judge
        now = wave.states[:, lo - index : hi - index]
        before = wave.previous[:, lo - old : hi - old]
        earlier = self.earlier[:, lo - older : hi - older]
        self.earlier, self.earlier_start = wave.previous.clone(), old
        return relative_norm((now - before) - (before - earlier), now, eps=1e-6)


def _token_stability(step: Step) -> torch.Tensor:
    assert step.wave is not None
    return step.wave.stability


# Logit computations ------------------------------------------------------------------------------
def minp_log_probs(logits: torch.Tensor, min_p: float = 0.1) -> torch.Tensor:
    """log q: softmax probabilities under ``min_p`` · the row's largest set to 1/V, renormalised."""
    probs = logits.float().softmax(dim=-1)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    probs = probs.masked_fill(probs < floor, 1.0 / probs.shape[-1])
    return (probs / probs.sum(dim=-1, keepdim=True)).log()


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(dim=-1)


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    return -(logp.exp() * logp).sum(dim=-1)


def _kl(logp: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    return (logp.exp() * (logp - prev)).sum(dim=-1)


def _reverse_kl(logq: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    return (prev.exp() * (prev - logq)).sum(dim=-1)


def _entropy_change(logp: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    return (_entropy(logp) - _entropy(prev)).abs()


class _Successive:
    """compare(now, prev) of successive log-distributions now = transform(logits); the first step
    is compared against the uniform distribution."""

    def __init__(self, transform: Callable, compare: Callable) -> None:
        self.transform, self.compare = transform, compare
        self.previous: torch.Tensor | None = None

    def __call__(self, step: Step) -> torch.Tensor:
        if step.logits is None:
            raise ValueError("a logit criterion was given a step without logits")
        now = self.transform(step.logits)
        prev = self.previous
        if prev is None:
            prev = now.new_full(now.shape, -math.log(now.shape[-1]))
        self.previous = now
        return self.compare(now, prev)


def successive(
    transform: Callable[[torch.Tensor], torch.Tensor],
    compare: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[[], Judge]:
    """The ``start`` of a criterion of successive next-token distributions: ``compare(now, prev)``
    with now = ``transform(logits)`` (e.g. log-probabilities), the first step against uniform."""
    return lambda: _Successive(transform, compare)


class _ArgmaxRun:
    """Steps the argmax has stayed the same (0 at the first step and after every change)."""

    def __init__(self) -> None:
        self.top: torch.Tensor | None = None
        self.count: torch.Tensor | None = None

    def __call__(self, step: Step) -> torch.Tensor:
        assert step.logits is not None
        top = step.logits.argmax(dim=-1)
        if self.top is None or self.count is None:
            self.count = top.new_zeros(top.shape)
        else:
            self.count = (self.count + 1).masked_fill(top != self.top, 0)
        self.top = top
        return self.count


class _CumulativeExit:
    """Σ_{j≤i} p_j of a learned exit gate: p_j = λ_j ∏_{k<j}(1 − λ_k), the published exit
    distribution (Ouro), so a row exits at the first step whose cumulative probability reaches the
    threshold."""

    def __init__(self) -> None:
        self.remaining: torch.Tensor | None = None

    def __call__(self, step: Step) -> torch.Tensor:
        if step.gate is None:
            raise ValueError("the exit-gate criterion was given a step without the exit gate")
        remaining = (
            step.gate.new_ones(step.gate.shape) if self.remaining is None else self.remaining
        )
        self.remaining = remaining * (1.0 - step.gate.float())
        return 1.0 - self.remaining


# The registry ------------------------------------------------------------------------------------
_GEN, _DIFF, _BOTH = ("generate",), ("diffusion",), ("generate", "diffusion")

#: Every criterion by name, in the order the command line and the app list them.
CRITERIA: dict[str, Criterion] = {}


def register(criterion: Criterion) -> Criterion:
    """Add ``criterion`` to :data:`CRITERIA`; a name already there, or an unknown use, is refused."""
    if criterion.name in (*CRITERIA, FIXED):
        raise ValueError(f"a criterion or freeze strategy named {criterion.name!r} already exists")
    unknown = set(criterion.used_by) - {"generate", "diffusion"}
    if unknown or not criterion.used_by:
        raise ValueError(f"criterion {criterion.name!r}: used_by must name generate and/or "
                         f"diffusion, got {criterion.used_by}")  # fmt: skip
    if "generate" in criterion.used_by and criterion.default_threshold is None:
        raise ValueError(f"criterion {criterion.name!r} is used by generate and needs a default")
    CRITERIA[criterion.name] = criterion
    return criterion


_BUILT_IN = (
    Criterion("kl", True, 5e-4, _GEN, "KL(p_i ‖ p_{i−1}) of successive next-token distributions",
              successive(_log_softmax, _kl)),
    Criterion("minp-kl", True, 1e-5, _GEN, "KL(q_{i−1} ‖ q_i) of min-p filtered distributions",
              successive(minp_log_probs, _reverse_kl)),
    Criterion("latent-diff", False, 0.03, _BOTH, "‖s_i − s_{i−1}‖ / ‖s_i‖", on_states(latent_diff)),
    Criterion("entropy-diff", True, 1e-3, _GEN, "|H(p_i) − H(p_{i−1})|",
              successive(_log_softmax, _entropy_change)),
    Criterion("cosine", False, 1e-3, _GEN, "1 − cos(s_i, s_{i−1})", on_states(cosine_distance)),
    Criterion("argmax-stability", True, 5, _GEN, "steps the argmax has stayed the same",
              _ArgmaxRun, operator.ge),
    Criterion("latent-acceleration-1", False, 0.03, _DIFF, "‖Δ_i − Δ_{i−1}‖ / ‖s_i‖",
              _Acceleration1),
    Criterion("latent-acceleration-2", False, 0.03, _DIFF, "‖Δ_i − Δ_{i−1}‖ / (‖s_i‖ + 1e-6)",
              _Acceleration2),
    Criterion("token-stability", True, None, _DIFF, "sampler steps the guess stayed the same",
              lambda: _token_stability, operator.gt),
    Criterion("exit-gate", False, 0.5, _GEN, "cumulative probability of the learned exit gate (Ouro)",
              _CumulativeExit, operator.ge, needs_gate=True),
)  # fmt: skip
for _criterion in _BUILT_IN:
    register(_criterion)


def names(use: str) -> tuple[str, ...]:
    """The registered criteria that ``use`` ("generate" or "diffusion") offers, in registry order."""
    return tuple(name for name, c in CRITERIA.items() if use in c.used_by)


def freeze_strategies() -> tuple[str, ...]:
    """The diffusion sampler's ``freeze_strategy`` values: its criteria, then "fixed" (headway
    tokens per step after a horizon, a schedule with no criterion)."""
    return (*names("diffusion"), FIXED)


def check_judged(value: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` itself, or :class:`NonFiniteState` when it holds a NaN (naming the criterion)."""
    bad = value.isnan()
    if bool(bad.any()):
        where = bad.nonzero()[:, -1].unique().tolist()
        raise NonFiniteState(
            f"the {name} criterion is NaN at index {where[:8]} (rows of a batch, or wave "
            "positions): the latent state or logits are not finite, so convergence cannot be judged"
        )
    return value
