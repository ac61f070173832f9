"""Every adaptive-exit and freeze criterion in one registry, with one guarded computation each.

Greedy generation (``sampling.ExitCriterion``) stops a token's iterations, and the diffusion sampler
(``diffusion``) freezes a wave position, when a criterion falls below a threshold. The state-based
criteria are relative norms, ‖Δ‖/‖s‖; here they are computed once, with their edge cases decided:

- ‖s‖ = 0 and ‖Δ‖ = 0 (a zero state that did not move) gives 0: converged;
- ‖s‖ = 0 and ‖Δ‖ > 0 gives +inf: not converged;
- a NaN anywhere gives NaN, and :func:`check_judged` turns a NaN criterion into a
  :class:`NonFiniteState` error instead of a position that silently never exits or freezes.

The logit-based criteria keep their state (the previous distribution, the unchanged-argmax count) in
``sampling.ExitCriterion``; the registry records their name, inputs and default threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "CRITERIA",
    "Criterion",
    "NonFiniteState",
    "check_judged",
    "cosine_distance",
    "latent_diff",
    "relative_norm",
]


class NonFiniteState(FloatingPointError):
    """A criterion met a NaN: the latent state or the logits are not finite."""


@dataclass(frozen=True)
class Criterion:
    """One exit or freeze criterion: where it is used, what it reads, its default threshold."""

    name: str
    needs_logits: bool
    default_threshold: float | None  # None: the sampler sets the horizon (token-stability)
    used_by: tuple[str, ...]
    meaning: str


_GEN, _DIFF, _BOTH = ("generate",), ("diffusion",), ("generate", "diffusion")

#: Every criterion by name. ``used_by``: "generate" (exit_criterion) and/or "diffusion" (freeze_strategy).
CRITERIA: dict[str, Criterion] = {
    c.name: c
    for c in (
        Criterion("kl", True, 5e-4, _GEN, "KL(p_i ‖ p_{i−1}) of successive next-token distributions"),
        Criterion("minp-kl", True, 1e-5, _GEN, "KL(q_{i−1} ‖ q_i) of min-p filtered distributions"),
        Criterion("latent-diff", False, 0.03, _BOTH, "‖s_i − s_{i−1}‖ / ‖s_i‖"),
        Criterion("entropy-diff", True, 1e-3, _GEN, "|H(p_i) − H(p_{i−1})|"),
        Criterion("cosine", False, 1e-3, _GEN, "1 − cos(s_i, s_{i−1})"),
        Criterion("argmax-stability", True, 5, _GEN, "steps the argmax has stayed the same"),
        Criterion("latent-acceleration-1", False, 0.03, _DIFF, "‖Δ_i − Δ_{i−1}‖ / ‖s_i‖"),
        Criterion("latent-acceleration-2", False, 0.03, _DIFF, "‖Δ_i − Δ_{i−1}‖ / (‖s_i‖ + 1e-6)"),
        Criterion("token-stability", True, None, _DIFF, "sampler steps the guess stayed the same"),
    )
}  # fmt: skip


def relative_norm(num: torch.Tensor, ref: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """‖num‖ / ‖ref‖ over the last axis; 0/0 → 0, x/0 → inf, NaN stays NaN.

    ``eps`` > 0 divides by ‖ref‖ + eps instead (the published latent-acceleration-2 formula).
    """
    top, bottom = num.norm(dim=-1), ref.norm(dim=-1)
    if eps > 0:
        return top / (bottom + eps)
    zero = bottom == 0
    ratio = top / torch.where(zero, torch.ones_like(bottom), bottom)
    at_zero = torch.where(top > 0, torch.full_like(top, float("inf")), top * 0)
    return torch.where(zero, at_zero, ratio)


def latent_diff(state: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """‖s − s_prev‖ / ‖s‖ per row of the last axis, guarded (see :func:`relative_norm`)."""
    return relative_norm(state - prev, state)


def cosine_distance(state: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """1 − cos(s, s_prev); two zero states did not move (0), one zero state did (1)."""
    value = 1 - torch.nn.functional.cosine_similarity(state, prev, dim=-1)
    both_zero = (state.norm(dim=-1) == 0) & (prev.norm(dim=-1) == 0)
    return torch.where(both_zero, torch.zeros_like(value), value)


def check_judged(value: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` itself, or :class:`NonFiniteState` when it holds a NaN (naming the criterion)."""
    bad = torch.isnan(value)
    if bool(bad.any()):
        where = bad.nonzero()[:, -1].unique().tolist()
        raise NonFiniteState(
            f"the {name} criterion is NaN at index {where[:8]} (rows of a batch, or wave "
            "positions): the latent state or logits are not finite, so convergence cannot be judged"
        )
    return value
