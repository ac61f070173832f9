"""What the corpus engine computes for each (prompt, seed) run: the same functions the app runs on
one prompt, applied to a batch's states.

- dynamics: ``classify_dynamics`` on the run's normalised states (kind, period, flip, settled,
  final_step_size, angular_speed, drift_speed), the token's category, and steps_to_converge
  (the first step after which the relative step stays below ``eps``; NaN if never);
- lens: the coda lens's KL to the final prediction and its entropy at chosen steps;
- seeds: the spread of the seeds' final states (mean pairwise distance / mean norm) and whether
  every seed gives the token the same kind;
- stability: each token's λ_1 (its Jacobian block along the trajectory from s_0 = 0) with its
  standard error and whether it is neutral.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from recurrent_model.functional import rms_norm

from ..convergence import relative_step_sizes
from ..dynamics import classify_dynamics
from ..lenses import lens_logits
from ..path_independence import _pairwise_mean_distance
from .heldout import token_category
from .units import Run, Tokenized

ANALYSES = ("dynamics", "lens", "seeds", "stability")
DYNAMICS_COLUMNS = [
    "token", "kind", "period", "flip", "settled", "final_step_size", "angular_speed", "drift_speed"
]  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """The analysis settings of a corpus run (all part of its identity)."""

    num_steps: int
    seeds: tuple[int, ...]
    analyses: tuple[str, ...] = ("dynamics",)
    lens_steps: tuple[int, ...] = ()
    init_scale: float = 1.0
    eps: float = 1e-2

    def __post_init__(self) -> None:
        unknown = set(self.analyses) - set(ANALYSES)
        if unknown or "dynamics" not in self.analyses:
            raise ValueError(
                f"analyses must include dynamics and be among {', '.join(ANALYSES)}; got "
                f"{', '.join(self.analyses)}"
            )
        if self.num_steps < 8:
            raise ValueError(f"--num-steps must be >= 8 (the dynamics tail), got {self.num_steps}")
        if "seeds" in self.analyses and len(self.seeds) < 2:
            raise ValueError("the seeds analysis compares seeds: give at least 2 with --seeds")
        bad = [s for s in self.lens_steps if not 0 <= s <= self.num_steps]
        if bad:
            raise ValueError(f"--lens-steps must lie in 0..{self.num_steps}, got {bad}")


def steps_to_converge(states: np.ndarray, eps: float) -> np.ndarray:
    """Per position of states (steps + 1, T, h): the first step i from which every relative step
    ‖z_j − z_{j−1}‖/‖z_j‖ (j ≥ i) is below ``eps`` (1 if all are); NaN when the last one is not.
    The relative steps are the app's convergence frame's, bit for bit (``relative_step_sizes``)."""
    above = ~(relative_step_sizes(states) < eps)  # (steps, T); step j + 1 for row j
    steps = above.shape[0]
    last = np.where(above.any(axis=0), steps - 1 - np.argmax(above[::-1], axis=0), -1)
    out = (last + 2).astype(np.float64)  # the step after the last one above
    out[last == steps - 1] = np.nan
    return out


def dynamics_rows(
    runs: Sequence[Run], states: np.ndarray, tokens: Sequence[Sequence[str]], eps: float
) -> pd.DataFrame:
    """The dynamics columns of several (prompt, seed) runs, in run order, from their normalised
    states side by side on the token axis (steps + 1, ΣT, h) and each run's token strings.

    One ``classify_dynamics`` call for all: a token's row depends on its own states only, so each
    run's rows are the bits ``classify_dynamics`` gives on that run alone."""
    lengths = [len(item.ids) for item, _ in runs]
    flat = [token for run_tokens in tokens for token in run_tokens]
    frame = classify_dynamics(states, tokens=flat, diagnostics=False)[DYNAMICS_COLUMNS]
    frame = frame.reset_index(drop=True)
    sources = np.repeat([item.prompt.source for item, _ in runs], lengths)
    frame.insert(0, "position", np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]))
    frame.insert(0, "seed", np.repeat(np.array([seed for _, seed in runs], np.int32), lengths))
    frame.insert(0, "prompt_id", np.repeat([item.prompt.id for item, _ in runs], lengths))
    frame.insert(0, "source", sources)
    frame.insert(
        5, "token_id", np.concatenate([np.asarray(item.ids, np.int64) for item, _ in runs])
    )
    frame["category"] = [token_category(t, source) for t, source in zip(flat, sources)]
    frame["steps_to_converge"] = steps_to_converge(states, eps)
    frame["difficulty"] = np.repeat([item.prompt.difficulty for item, _ in runs], lengths)
    return frame


@torch.no_grad()
def lens_columns(
    model: torch.nn.Module,
    raw: torch.Tensor,
    valid: torch.Tensor,
    steps: Sequence[int],
    chunk_bytes: int = 2**28,
    rows: int = 16,
) -> dict[str, torch.Tensor]:
    """Coda-lens KL to the final prediction and entropy at ``steps`` of a batch: raw states
    (steps + 1, B, W, h) in the aligned layout on the model's device, ``valid`` (B, W) its real
    positions. ``lens_kl_{s}`` and ``lens_entropy_{s}``, each (ΣT,) on the device in run order.

    The runs go through the coda together, as many at a time as keep the logits within
    ``chunk_bytes``; each run keeps its aligned rows, so its numbers do not depend on the others.
    On the CPU the softmax, KL and entropy then take ``rows`` real positions at a time, so each
    block stays in cache; every number is one row's own (the same bits in any block)."""
    picks = [*steps, raw.shape[0] - 1]  # the final state last
    width = raw.shape[2]
    per_run = len(picks) * width * model.config.vocab_size * 4 * 3
    chunk = max(1, chunk_bytes // per_run)
    kl, entropy = [], []
    for start in range(0, raw.shape[1], chunk):
        x = raw[picks, start : start + chunk].to(model.dtype).flatten(0, 1)
        logits = lens_logits(model, x, "coda").unflatten(0, (len(picks), -1)).flatten(1, 2)
        real = valid[start : start + chunk].flatten().nonzero().squeeze(1)
        for block in real.split(rows if raw.device.type == "cpu" else len(real)):
            logp = torch.log_softmax(logits[:, block], dim=-1)
            final, logp = logp[-1], logp[:-1]
            kl.append((final.exp() * (final - logp)).sum(-1).clamp_min(0.0))
            entropy.append(-(logp.exp() * logp).sum(-1))
    kl, entropy = torch.cat(kl, 1).float(), torch.cat(entropy, 1).float()
    out: dict[str, torch.Tensor] = {}
    for i, step in enumerate(steps):
        out[f"lens_kl_{step}"] = kl[i]
        out[f"lens_entropy_{step}"] = entropy[i]
    return out


def seed_columns(finals: np.ndarray, kinds: np.ndarray) -> dict[str, np.ndarray]:
    """From the seeds' final normalised states (n_seeds, T, h) and kinds (n_seeds, T): ``seed_spread``
    (mean pairwise distance / mean norm) and ``seed_kinds_agree``."""
    distance = _pairwise_mean_distance(finals)
    norm = np.linalg.norm(finals, axis=-1).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = distance / norm
    return {"seed_spread": spread, "seed_kinds_agree": (kinds == kinds[:1]).all(axis=0)}


def stability_columns(model, run: Tokenized, num_steps: int) -> dict[str, np.ndarray]:
    """λ_1 of every token's Jacobian block along the s_0 = 0 trajectory, with its error."""
    from ..core_map import problems
    from ..lyapunov import token_exponent_table

    rows, _ = problems(model, torch.tensor(run.ids), None, 0, 0.0, 0)
    table = token_exponent_table(rows[0].map, rows[0].start, num_steps)
    return {
        "lambda_1": table["exponent"].to_numpy(),
        "lambda_1_stderr": table["stderr"].to_numpy(),
        "lambda_1_neutral": table["neutral"].to_numpy(),
    }


def normalise(model: torch.nn.Module, raw: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The family's normalised view (Huginn: ln_f) of the real positions ``valid`` (B, W) of raw
    states (steps + 1, B, W, h): (steps + 1, ΣT, h) on their device, with the arithmetic of
    ``Trajectory.states``. One step at a time, so each step's temporaries stay in cache (every
    row is normed alone: the same bits as all steps at once). States a family has normalised
    already are only gathered."""
    norm = model.state_norm()
    if norm is None:
        return raw[:, valid]
    weight, eps = norm.weight.detach().float(), float(norm.eps)
    out = torch.empty((raw.shape[0], int(valid.sum()), raw.shape[-1]), device=raw.device)
    for step in range(raw.shape[0]):
        out[step] = rms_norm(raw[step][valid].float(), weight, eps)
    return out


def default_lens_steps(num_steps: int, mean_recurrence: int) -> tuple[int, ...]:
    """Default lens steps: 1, a quarter of r̄, r̄ and the last step below the final one."""
    picks = {1, max(1, mean_recurrence // 4), min(mean_recurrence, num_steps - 1)}
    return tuple(sorted(s for s in picks if 0 < s < num_steps)) or (max(0, num_steps - 1),)
