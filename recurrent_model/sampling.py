"""Next-token choice (greedy, temperature / top-k / top-p / min-p sampling) and adaptive-exit criteria."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .criteria import CRITERIA, Step, minp_log_probs, names

__all__ = ["DEFAULT_THRESHOLDS", "EXIT_CRITERIA", "ExitCriterion", "Sampler", "minp_log_probs"]

#: The built-in exit criteria of greedy generation, in the registry's order (``criteria.CRITERIA``);
#: :class:`ExitCriterion` accepts every criterion registered for "generate".
EXIT_CRITERIA = names("generate")
DEFAULT_THRESHOLDS = {name: CRITERIA[name].default_threshold for name in EXIT_CRITERIA}


@dataclass(frozen=True)
class Sampler:
    """How the next token is chosen from float32 logits (B, V): argmax unless ``do_sample``."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampling distribution (B, V) after temperature, top-k, min-p and top-p."""
        logits = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.min_p is not None and self.min_p > 0:
            floor = self.min_p * probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)
        if self.top_p is not None and self.top_p < 1:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
            sorted_p = sorted_p.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        return probs / probs.sum(dim=-1, keepdim=True)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row from a distribution (B, V)."""
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def choose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tokens (B,), the distribution they were drawn from or None when greedy)."""
        if not self.do_sample:
            return logits.argmax(dim=-1), None
        probs = self.probs(logits)
        return self.draw(probs), probs


class ExitCriterion:
    """Per-row convergence test after each core iteration, computed by the registry's criterion
    (``criteria.CRITERIA``); a row exits when the criterion passes its threshold.

    "kl": KL(p_i ‖ p_{i−1}) of successive next-token distributions (the first step against uniform);
    "entropy-diff": |H(p_i) − H(p_{i−1})|; "latent-diff": ‖s_i − s_{i−1}‖/‖s_i‖;
    "cosine": 1 − cos(s_i, s_{i−1}); "argmax-stability": exit once the argmax has stayed the same for
    ``threshold`` consecutive steps (the threshold is a step count here); "minp-kl": as the published
    implementation's ``MinKLExitEvaluator``, KL(q_{i−1} ‖ q_i) of min-p filtered distributions q
    (probabilities under 0.1 · the largest set to 1/V, renormalised; q_0 uniform).
    """

    def __init__(self, name: str, threshold: float | None = None) -> None:
        offered = names("generate")
        if name not in offered:
            raise ValueError(f"unknown exit criterion {name!r}; choose from {', '.join(offered)}")
        self.name = name
        self.criterion = CRITERIA[name]
        default = self.criterion.default_threshold
        self.threshold = float(default if threshold is None else threshold)
        if not self.threshold >= 0:
            raise ValueError(f"exit_threshold must be >= 0, got {threshold}")
        self.needs_logits = self.criterion.needs_logits
        self._judge = self.criterion.start()

    def reset(self) -> None:
        """Forget the previous step (call at the start of every token)."""
        self._judge = self.criterion.start()

    def __call__(
        self,
        state: torch.Tensor,
        prev_state: torch.Tensor,
        logits: torch.Tensor | None,
        gate: torch.Tensor | None = None,
    ):
        """Boolean (B,): rows whose criterion says "converged" after this step.

        state, prev_state: (B, 1, h) raw states s_i, s_{i−1}; logits: (B, V) when ``needs_logits``;
        gate: (B,) the step's exit probability λ_i for a criterion that reads a learned gate.
        """
        step = Step(state[:, -1].float(), prev_state[:, -1].float(), logits, gate=gate)
        return self.criterion.converged(self._judge(step), self.threshold)
