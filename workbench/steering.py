"""Steering over depth: add α·v (or rotate within a plane) at iterations i … j, and measure the effect.

Directions come from a difference of means between two prompt sets, a PCA component of collected
states, or a rotation plane (a vector in the plane at an angle). The hooks built here are ordinary
``model.hooks`` functions, so they act in a forward pass and in ``model.generate`` alike (generation
switches to its hooked path whenever a hook function is attached).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from recurrent_model.hook_names import STATE

from .collect import token_strings
from .interventions_common import (
    cached_index,
    encode_prompt,
    hook_steps,
    is_active,
    orthonormal_rows,
    position_mask,
    run_init,
    step_range,
)

Prompt = str | Sequence[int] | torch.Tensor | np.ndarray


def add_vector_hook(
    vector: np.ndarray | torch.Tensor,
    alpha: float,
    steps: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
):
    """A hook function adding α·v to the activation at iterations first … last (inclusive; None =
    every firing) and at ``positions`` (None = every position)."""
    steps = step_range(steps)
    v = torch.as_tensor(np.asarray(vector) if isinstance(vector, np.ndarray) else vector)
    alpha = float(alpha)
    if v.dim() != 1 or not torch.isfinite(v).all() or not np.isfinite(alpha):
        raise ValueError(
            f"steering needs one finite vector (h,) and a finite α, got {tuple(v.shape)}"
        )

    def fn(x: torch.Tensor, hook) -> torch.Tensor | None:
        if not is_active(hook, steps) or alpha == 0:
            return None
        if v.shape[-1] != x.shape[-1]:
            raise ValueError(f"the vector has size {v.shape[-1]}, the activation {x.shape[-1]}")
        delta = alpha * v.to(device=x.device, dtype=x.dtype)
        mask = position_mask(positions, x)
        return x + delta if mask is None else torch.where(mask, x + delta, x)

    return fn


def rotate_plane_hook(
    plane: np.ndarray | torch.Tensor,
    angle: float,
    steps: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
):
    """A hook function rotating the activation's component in ``plane`` (2, h; orthonormalised here)
    by ``angle`` radians at iterations first … last and at ``positions``; the rest is untouched."""
    steps = step_range(steps)
    q = orthonormal_rows(plane)
    if q.shape[0] != 2:
        raise ValueError(f"a rotation plane has 2 basis vectors, got {q.shape[0]}")
    c, s = float(np.cos(angle)), float(np.sin(angle))
    rot = torch.tensor([[c, s], [-s, c]], dtype=q.dtype)  # row-vector coordinates rotated by +angle

    def fn(x: torch.Tensor, hook) -> torch.Tensor | None:
        if not is_active(hook, steps):
            return None
        qd, rd = q.to(device=x.device, dtype=x.dtype), rot.to(device=x.device, dtype=x.dtype)
        coords = x @ qd.T
        out = x + (coords @ rd - coords) @ qd
        mask = position_mask(positions, x)
        return out if mask is None else torch.where(mask, out, x)

    return fn


def plane_vector(plane: np.ndarray | torch.Tensor, angle: float) -> torch.Tensor:
    """cos(angle)·u + sin(angle)·w for the orthonormalised plane basis (u, w): a unit vector."""
    q = orthonormal_rows(plane)
    return float(np.cos(angle)) * q[0] + float(np.sin(angle)) * q[1]


def pca_direction(states: np.ndarray | torch.Tensor, component: int = 0) -> np.ndarray:
    """Unit vector of principal component ``component`` of states (..., h) (all leading axes pooled),
    sign fixed so that its largest entry is positive."""
    x = np.asarray(states, dtype=np.float64).reshape(-1, np.shape(states)[-1])
    if not 0 <= component < min(x.shape):
        raise ValueError(f"component {component} is out of range for {x.shape[0]} states")
    _, _, vt = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)
    v = vt[component]
    return v * np.sign(v[np.argmax(np.abs(v))])


def prompt_states(
    model,
    prompts: Sequence[Prompt],
    num_steps: int,
    *,
    hook: str = STATE,
    step: int | None = None,
    position: int = -1,
    init_scale: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """The activation of ``hook`` at ``step`` (default: the last) and ``position`` (−1 = last token)
    for each prompt (text or ids), stacked (n_prompts, h)."""
    valid = hook_steps(model, hook, int(num_steps))
    step = valid[-1] if step is None else int(step)
    if step not in valid:
        raise ValueError(f"{hook!r} does not fire at step {step}")
    rows = []
    with torch.no_grad():
        for prompt in prompts:
            ids = encode_prompt(model, prompt).to(model.device)
            init = run_init(model, ids.shape[1], init_scale, seed, 1)
            _, cache = model.run_with_cache(ids, num_steps=num_steps, names_filter=hook, **init)
            index = cached_index(hook, step)
            act = cache[hook] if index is None else cache[hook][index]
            rows.append(act[0, position].double().cpu().numpy())
    return np.stack(rows)


def difference_of_means(
    model,
    prompts_a: Sequence[Prompt],
    prompts_b: Sequence[Prompt],
    num_steps: int,
    **kwargs,
) -> np.ndarray:
    """mean(state | prompts_a) − mean(state | prompts_b), the states taken as in `prompt_states`."""
    if not prompts_a or not prompts_b:
        raise ValueError("difference_of_means needs at least one prompt in each set")
    a = prompt_states(model, prompts_a, num_steps, **kwargs)
    b = prompt_states(model, prompts_b, num_steps, **kwargs)
    return a.mean(axis=0) - b.mean(axis=0)


LAST_POSITION_MEASURE = "KL(baseline ‖ steered) of the next-token distribution at the last position"


@dataclass(frozen=True)
class SteeringEffect:
    """The effect of a set of hooks on the next-token distributions.

    ``kl`` = KL(baseline ‖ steered) at the last position (``measure`` says so);
    ``kl_by_position`` the same at every position (T,), so that ``kl_from(p)`` gives the
    ablation's measure (the mean over positions p … T−1); ``logprob_change`` of ``target``
    (default: baseline's top token) at the last position; ``top_k`` a table with the baseline's
    and the steered run's top tokens and probabilities there.
    """

    kl: float
    logprob_change: float
    target: int
    top_k: pd.DataFrame
    kl_by_position: np.ndarray
    measure: str = LAST_POSITION_MEASURE

    def kl_from(self, position: int) -> float:
        """Mean KL over positions ``position`` … T−1 (`AblationResult.effect`'s measure)."""
        length = len(self.kl_by_position)
        if not -length <= int(position) < length:
            raise ValueError(f"position {position} is outside the {length} tokens")
        return float(self.kl_by_position[int(position) % length :].mean())


def _token(model, token_id: int) -> str:
    return token_strings(model, [token_id])[0]


def steering_effect(
    model,
    input_ids: Prompt,
    num_steps: int,
    fwd_hooks: Sequence[tuple],
    *,
    target: int | None = None,
    top_k: int = 5,
    init_scale: float = 0.0,
    seed: int = 0,
) -> SteeringEffect:
    """Run ``input_ids`` with and without ``fwd_hooks`` (same s_0) and compare the next-token
    distributions: at the last position (``kl``, ``top_k``) and at every position."""
    ids = encode_prompt(model, input_ids).to(model.device)
    init = run_init(model, ids.shape[1], init_scale, seed, 1)
    with torch.no_grad():
        base_all = torch.log_softmax(model(ids, num_steps=num_steps, **init).logits[0].float(), -1)
        with model.hooks(list(fwd_hooks)):
            logits = model(ids, num_steps=num_steps, **init).logits[0]
    steered_all = torch.log_softmax(logits.float(), -1)
    kl_all = torch.sum(base_all.exp() * (base_all - steered_all), -1).clamp_min(0.0)
    base, steered = base_all[-1], steered_all[-1]
    target = int(base.argmax()) if target is None else int(target)
    kl = float(kl_all[-1])
    k = min(int(top_k), base.numel())
    bp, bi = base.exp().topk(k)
    sp, si = steered.exp().topk(k)
    table = pd.DataFrame(
        {
            "rank": np.arange(1, k + 1),
            "baseline_token": [_token(model, int(i)) for i in bi],
            "baseline_prob": bp.cpu().numpy(),
            "steered_token": [_token(model, int(i)) for i in si],
            "steered_prob": sp.cpu().numpy(),
        }
    )
    change = float(steered[target] - base[target])
    return SteeringEffect(kl, change, target, table, kl_all.cpu().numpy().astype(np.float64))


def steering_sweep(
    model,
    input_ids: Prompt,
    num_steps: int,
    vector: np.ndarray | torch.Tensor,
    alphas: Sequence[float],
    *,
    steps: tuple[int, int] | None = None,
    hook: str = STATE,
    target: int | None = None,
    init_scale: float = 0.0,
) -> pd.DataFrame:
    """`steering_effect` of adding α·v at iterations ``steps`` for every α: one row per α with
    ``alpha``, ``kl``, ``logprob_change`` and the steered run's ``top_token``."""
    rows = []
    for alpha in alphas:
        eff = steering_effect(
            model, input_ids, num_steps, [(hook, add_vector_hook(vector, alpha, steps))],
            target=target, top_k=1, init_scale=init_scale,
        )  # fmt: skip
        rows.append(
            {
                "alpha": float(alpha),
                "kl": eff.kl,
                "logprob_change": eff.logprob_change,
                "top_token": eff.top_k.steered_token[0],
            }
        )
    return pd.DataFrame(rows)


def steered_generation(
    model,
    input_ids: Prompt,
    max_new_tokens: int,
    num_steps: int,
    fwd_hooks: Sequence[tuple],
    *,
    init_scale: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuations (1, T + new) without and with ``fwd_hooks`` active during generation.

    Hooks should act on every position (``positions=None``): generation runs the prompt, then one
    token at a time, so a position index inside a hook refers to the chunk, not to the sequence.
    """
    ids = encode_prompt(model, input_ids).to(model.device)
    kwargs = {"num_steps": num_steps, "init_scale": init_scale}
    base = model.generate(ids, max_new_tokens, **kwargs)
    with model.hooks(list(fwd_hooks)):
        steered = model.generate(ids, max_new_tokens, **kwargs)
    return base, steered
