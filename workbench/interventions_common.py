"""Pieces shared by the intervention tools (patching, steering, ablation).

Inputs are checked here once: token ids as one (1, T) sequence, a fixed s_0 shared by every run of an
experiment (so that only the intervention differs between runs), the log-probabilities at a position,
and the steps at which a hook fires.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from recurrent_model.hook_names import STATE, first_step

from .collect import as_token_ids, random_start, token_strings


class Cancelled(RuntimeError):
    """An intervention run stopped by its caller's ``should_stop`` check (the app's Stop button)."""


def encode_prompt(model, prompt: str | torch.Tensor | np.ndarray | Sequence[int]) -> torch.Tensor:
    """A prompt given as text (encoded with the model's tokenizer) or as token ids, as (1, T)."""
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError("text prompts need a model with a tokenizer; pass token ids instead")
        return as_token_ids(model.tokenizer.encode(prompt), "prompt")
    return as_token_ids(prompt, "prompt")


def fixed_init_state(
    model, length: int, init_scale: float, seed: int = 0, batch: int = 1
) -> torch.Tensor | None:
    """s_0 for ``batch`` rows of ``length`` tokens: None (the family's own start: zeros for
    init_scale 0, the embedding for Ouro) or one random draw from the model's s_0 distribution
    (seeded), the same for every row."""
    if init_scale < 0:
        raise ValueError(f"init_scale must be >= 0, got {init_scale}")
    if init_scale == 0 or not random_start(model):
        return None
    h = model.config.n_embd
    shape_like = torch.zeros(1, length, h, device=model.device, dtype=model.dtype)
    gen = torch.Generator(device=model.device).manual_seed(int(seed))
    s0 = model.initial_state(shape_like, init_scale, gen)
    return s0.expand(batch, -1, -1).contiguous()


def run_init(
    model, length: int, init_scale: float, seed: int, batch: int
) -> dict[str, torch.Tensor | float]:
    """Forward keyword arguments that fix s_0 (zeros or one seeded draw) for ``batch`` rows."""
    s0 = fixed_init_state(model, length, init_scale, seed, batch)
    return {"init_scale": 0.0} if s0 is None else {"init_state": s0}


def log_probs(logits: torch.Tensor, position: int = -1) -> torch.Tensor:
    """Log-softmax of float32 logits (B, T, V) at one position, (B, V)."""
    return torch.log_softmax(logits[:, position].float(), dim=-1)


def hook_steps(model, hook: str, num_steps: int) -> list[int | None]:
    """Every value of ``hook.step`` with which ``hook`` fires in a forward of ``num_steps``:
    0 … r for core.hook_state, 1 … r for other per-iteration hooks, [None] outside the core."""
    point = model.hook_point(hook)  # raises HookError naming the hook
    if not point.iterated:
        return [None]
    return list(range(first_step(hook), num_steps + 1))


def cached_index(hook: str, step: int | None) -> int | None:
    """Index along the step axis of ``run_with_cache``'s stacked tensor for ``hook`` at ``step``."""
    if step is None:
        return None
    return step if hook == STATE else step - 1


def token_labels(model, ids: torch.Tensor) -> list[str]:
    """Token strings of a (1, T) sequence (the ids as strings when the model has no tokenizer)."""
    return token_strings(model, ids[0].tolist())


def check_steps(
    steps: Sequence[int] | None, valid: list[int | None], hook: str
) -> list[int | None]:
    """The requested steps (None = all valid ones), each checked against ``valid``."""
    if steps is None:
        return valid
    chosen = [int(s) for s in steps]
    bad = [s for s in chosen if s not in valid]
    if bad:
        raise ValueError(
            f"{hook!r} does not fire at step(s) {bad}; it fires at {valid[0]} … {valid[-1]}"
            if valid != [None]
            else f"{hook!r} fires once, outside the recurrence: pass steps=None"
        )
    return chosen


def step_range(steps: tuple[int, int] | None) -> tuple[int, int] | None:
    if steps is None:
        return None
    first, last = (int(s) for s in steps)
    if first > last or first < 0:
        raise ValueError(f"steps must be (first, last) with 0 <= first <= last, got {steps}")
    return first, last


def is_active(hook, steps: tuple[int, int] | None) -> bool:
    """Whether a hook firing is inside the (first, last) iteration range (None = every firing)."""
    if steps is None:
        return True
    return hook.step is not None and steps[0] <= hook.step <= steps[1]


def position_mask(positions: Sequence[int] | None, x: torch.Tensor) -> torch.Tensor | None:
    """(1, T, 1) mask of the positions to steer (None = all), negative positions from the end."""
    if positions is None:
        return None
    mask = torch.zeros(1, x.shape[1], 1, dtype=torch.bool, device=x.device)
    mask[0, [int(p) for p in positions]] = True
    return mask


def orthonormal_rows(basis: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Orthonormal rows (k, h) spanning the rows of ``basis`` (k, h) (or one vector (h,))."""
    b = torch.as_tensor(np.asarray(basis) if isinstance(basis, np.ndarray) else basis).double()
    if b.dim() == 1:
        b = b[None]
    if b.dim() != 2 or b.shape[0] > b.shape[1]:
        raise ValueError(f"a basis is (k, h) with k <= h, got shape {tuple(b.shape)}")
    if not torch.isfinite(b).all():
        raise ValueError("the basis holds NaN or inf")
    q, r = torch.linalg.qr(b.T)
    if (r.diagonal().abs() < 1e-10 * max(float(b.abs().max()), 1e-300)).any():
        raise ValueError("the basis vectors are linearly dependent (or zero)")
    signs = torch.sign(r.diagonal())  # Gram–Schmidt order and signs: row 0 is b[0] / ‖b[0]‖
    return (q * signs).T.contiguous()
