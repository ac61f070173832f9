"""Next-token choice (greedy, temperature / top-k / top-p / min-p sampling) and adaptive-exit criteria."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .criteria import CRITERIA, check_judged, cosine_distance, latent_diff

#: The exit criteria of greedy generation, in the registry's order (``criteria.CRITERIA``).
EXIT_CRITERIA = tuple(name for name, c in CRITERIA.items() if "generate" in c.used_by)
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
    """Per-row convergence test after each core iteration; a row exits when its value < threshold.

    "kl": KL(p_i ‖ p_{i−1}) of successive next-token distributions (the first step against uniform);
    "entropy-diff": |H(p_i) − H(p_{i−1})|; "latent-diff": ‖s_i − s_{i−1}‖/‖s_i‖;
    "cosine": 1 − cos(s_i, s_{i−1}); "argmax-stability": exit once the argmax has stayed the same for
    ``threshold`` consecutive steps (the threshold is a step count here); "minp-kl": as the published
    implementation's ``MinKLExitEvaluator``, KL(q_{i−1} ‖ q_i) of min-p filtered distributions q
    (probabilities under 0.1 · the largest set to 1/V, renormalised; q_0 uniform).
    """

    def __init__(self, name: str, threshold: float | None = None) -> None:
        if name not in EXIT_CRITERIA:
            raise ValueError(
                f"unknown exit criterion {name!r}; choose from {', '.join(EXIT_CRITERIA)}"
            )
        self.name = name
        self.threshold = float(DEFAULT_THRESHOLDS[name] if threshold is None else threshold)
        if not self.threshold >= 0:
            raise ValueError(f"exit_threshold must be >= 0, got {threshold}")
        self.needs_logits = CRITERIA[name].needs_logits
        self._prev: torch.Tensor | None = None
        self._count: torch.Tensor | None = None

    def reset(self) -> None:
        """Forget the previous step (call at the start of every token)."""
        self._prev = None
        self._count = None

    def __call__(self, state: torch.Tensor, prev_state: torch.Tensor, logits: torch.Tensor | None):
        """Boolean (B,): rows whose criterion says "converged" after this step.

        state, prev_state: (B, 1, h) raw states s_i, s_{i−1}; logits: (B, V) when ``needs_logits``.
        """
        name = self.name
        if name in ("latent-diff", "cosine"):
            s, p = state[:, -1].float(), prev_state[:, -1].float()
            value = latent_diff(s, p) if name == "latent-diff" else cosine_distance(s, p)
            return check_judged(value, name) < self.threshold
        assert logits is not None
        if name == "argmax-stability":
            top = logits.argmax(dim=-1)
            if self._prev is None:
                self._count = torch.zeros_like(top)
            else:
                same = top == self._prev
                self._count = torch.where(same, self._count + 1, torch.zeros_like(self._count))
            self._prev = top
            return self._count >= self.threshold
        if name == "minp-kl":
            logq = minp_log_probs(logits)
            prev = self._prev
            if prev is None:
                prev = torch.full_like(logq, -math.log(logq.shape[-1]))
            self._prev = logq
            return check_judged((prev.exp() * (prev - logq)).sum(dim=-1), name) < self.threshold
        logp = torch.log_softmax(logits.float(), dim=-1)
        prev = self._prev
        if prev is None:
            prev = torch.full_like(logp, -math.log(logp.shape[-1]))
        self._prev = logp
        if name == "kl":
            value = (logp.exp() * (logp - prev)).sum(dim=-1)
        else:
            value = (_entropy(logp) - _entropy(prev)).abs()
        return check_judged(value, name) < self.threshold


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    return -(logp.exp() * logp).sum(dim=-1)


def minp_log_probs(logits: torch.Tensor, min_p: float = 0.1) -> torch.Tensor:
    """log q: softmax probabilities under ``min_p`` · the row's largest set to 1/V, renormalised."""
    probs = torch.softmax(logits.float(), dim=-1)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    probs = torch.where(probs < floor, 1.0 / probs.shape[-1], probs)
    return (probs / probs.sum(dim=-1, keepdim=True)).log()
