"""Cached computations behind the Interventions tab: patching, steering and ablation.

Like ``apps.compute``: each is a ``cached_analysis`` keyed by the model's ``cache_key``; every other
argument is hashed (a steering vector and plane too: they are small), so a rerun that changes
nothing recomputes nothing. Each function is one workbench call (plus the token bookkeeping the tab
needs).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pandas as pd
import torch

import workbench
from recurrent_model.hook_names import STATE
from recurrent_model.threads import threads_for
from workbench._frames import token_display_strings
from workbench.interventions_common import run_init

from . import cost
from .cached import cached_analysis
from .compute import TaskProgress, estimate_flops, generation_estimate


def corrupt(token_ids: tuple[int, ...], position: int, token_id: int) -> tuple[int, ...]:
    """The token ids with the one at ``position`` replaced by ``token_id``."""
    ids = list(token_ids)
    ids[position] = int(token_id)
    return tuple(ids)


def one_token(tokenizer, text: str) -> int:
    """The id of ``text`` when it is exactly one token, else a ValueError saying what it became."""
    ids = tokenizer.encode(text, add_bos=False)
    if len(ids) != 1:
        raise ValueError(
            f"{text!r} is {len(ids)} tokens ({tokenizer.token_strings(ids)}); the replacement "
            "must be exactly one token so that the clean and corrupted prompts align"
        )
    return int(ids[0])


@cached_analysis(keyed=("model",), max_entries=8)
def patching(
    model,
    clean: tuple[int, ...],
    corrupted: tuple[int, ...],
    num_steps: int,
    hook: str,
    positions: str,
    direction: str,
    init_scale: float,
    seed: int,
    metric: str = "logit_diff",
    target: int | None = None,
    corrupted_target: int | None = None,
    batch_size: int = 64,
    _progress: TaskProgress | None = None,
) -> pd.DataFrame:
    """`workbench.patch_states` over every position (or all at once) and step, ``batch_size``
    patches per forward; with ``_progress`` a bar follows the patches (and Stop ends them between
    batches). Unhashed, so a rerun with a new bar still hits the cache."""
    with threads_for(model), _forwards(model, _progress):
        frame = workbench.patch_states(
            model, list(clean), list(corrupted), num_steps, hook=hook, positions=positions,
            direction=direction, init_scale=init_scale, seed=seed, metric=metric, target=target,
            corrupted_target=corrupted_target, batch_size=batch_size,
            progress=_progress if _progress is not None else False,
        )  # fmt: skip
    if _progress is not None:
        _progress.finish()
    return frame


@cached_analysis(keyed=("model",), max_entries=16)
def answer(
    model, token_ids: tuple[int, ...], num_steps: int, init_scale: float,
    seed: int,
) -> tuple[str, float]:  # fmt: skip
    """The run's top next token at the last position and its probability (the patching s_0)."""
    progress = forwards_progress(model, "The run's answer", len(token_ids), num_steps, 1)
    with threads_for(model), torch.no_grad(), _forwards(model, progress, 1, num_steps):
        init = run_init(model, len(token_ids), init_scale, seed, 1)
        ids = torch.tensor([token_ids], device=model.device)
        probs = torch.softmax(model(ids, num_steps=num_steps, **init).logits[0, -1].float(), -1)
    progress.finish()
    top = int(probs.argmax())
    return token_display_strings(model.tokenizer, [top])[0], float(probs[top])


@cached_analysis(keyed=("model",), max_entries=8)
def mean_difference(
    model,
    prompts_a: tuple[str, ...],
    prompts_b: tuple[str, ...],
    num_steps: int,
) -> np.ndarray:
    """Difference of the mean last-token final states of two prompt sets (s_0 = 0)."""
    prompts = [*prompts_a, *prompts_b]
    tokens = max(len(model.tokenizer.encode(p)) for p in prompts)
    what = f"Mean states of {len(prompts)} prompts"
    progress = forwards_progress(model, what, tokens, num_steps, len(prompts))
    with threads_for(model), _forwards(model, progress, len(prompts), num_steps):
        v = workbench.difference_of_means(model, list(prompts_a), list(prompts_b), num_steps)
    progress.finish()
    return v


@cached_analysis(keyed=("model",), max_entries=16)
def token_plane(model, token_ids: tuple[int, ...], num_steps: int, position: int) -> np.ndarray:
    """The rotation plane (2, h) of one token's raw core states (s_0 = 0)."""
    what = f"The rotation plane of token {position}"
    progress = forwards_progress(model, what, len(token_ids), num_steps, 1)
    with threads_for(model), _forwards(model, progress, 1, num_steps):
        plane = workbench.token_rotation_plane(model, list(token_ids), num_steps, position)
    progress.finish()
    return plane


def forwards_progress(model, what: str, tokens: int, num_steps: int, forwards: int) -> TaskProgress:
    """The bar of ``forwards`` plain forwards over ``tokens`` tokens at ``num_steps``, with
    their estimate (calibrated as one kind of action: a few forwards)."""
    config = model.config
    flops = cost.forward_flops(config, tokens, num_steps, forwards)
    calls = cost.forward_calls(config, num_steps, forwards)
    guess = estimate_flops(model, flops, rows=tokens, calls=calls, action="forwards")
    return TaskProgress(what, "forwards", guess)


def _hooks(vector: np.ndarray | None, plane: np.ndarray | None, mode: str, amount: float, steps):
    if mode == "rotate":
        return [(STATE, workbench.rotate_plane_hook(plane, amount, steps))]
    return [(STATE, workbench.add_vector_hook(vector, amount, steps))]


SWEEP_POINTS = 6


def sweep_alphas(amount: float) -> np.ndarray:
    """The α sweep beside an added vector: 0 … α in SWEEP_POINTS steps (just 0 when α is 0)."""
    return np.linspace(0.0, amount, SWEEP_POINTS) if amount else np.zeros(1)


def steering_forwards(mode: str, amount: float) -> int:
    """Forwards of one steering request: the baseline and the steered run, and both again for
    every α of the sweep when adding a vector."""
    return 2 + (2 * len(sweep_alphas(amount)) if mode == "add" else 0)


def steering_estimate(
    model, tokens: int, num_steps: int, mode: str, amount: float
) -> cost.CostEstimate:
    """The estimated time of one steering request (see steering_forwards)."""
    forwards = steering_forwards(mode, amount)
    flops = cost.forward_flops(model.config, tokens, num_steps, forwards)
    calls = cost.forward_calls(model.config, num_steps, forwards)
    return estimate_flops(model, flops, rows=tokens, calls=calls, action="steering")


@cached_analysis(keyed=("model",), max_entries=16)
def steering(
    model,
    token_ids: tuple[int, ...],
    num_steps: int,
    vector: np.ndarray | None,
    plane: np.ndarray | None,
    mode: str,
    amount: float,
    steps: tuple[int, int],
    _progress: TaskProgress | None = None,
) -> dict:
    """Effect on the last position's next-token distribution (and an α sweep when adding); with
    ``_progress`` a bar follows the forwards and every block call is a stop point."""
    hooks = _hooks(vector, plane, mode, amount, steps)
    with (
        threads_for(model),
        _forwards(model, _progress, steering_forwards(mode, amount), num_steps),
    ):
        effect = workbench.steering_effect(model, list(token_ids), num_steps, hooks)
        sweep = None
        if mode == "add":
            alphas = sweep_alphas(amount)
            sweep = workbench.steering_sweep(
                model, list(token_ids), num_steps, vector, alphas, steps=steps
            )
    if _progress is not None:
        _progress.finish()
    return {"effect": effect, "sweep": sweep}


def _forwards(model, progress: TaskProgress | None, forwards: int = 0, num_steps: int = 0):
    """Start ``progress`` and make every block call a stop point; with ``forwards`` the bar
    counts that many passes of ``num_steps`` iterations (the core's state hook fires for s_0 …
    s_r). Nothing without a bar."""
    if progress is None:
        return nullcontext()
    progress.start()
    if not forwards:
        return progress.watching(model)
    return progress.watching(model, per_unit=num_steps + 1, total=forwards)


def steered_text_estimate(model, tokens: int, new_tokens: int, num_steps: int) -> cost.CostEstimate:
    """The estimated time of two greedy continuations (without and with the hook), calibrated
    by the last one."""
    return generation_estimate(model, tokens, new_tokens, num_steps, 2, "steered generation")


@cached_analysis(keyed=("model",), max_entries=8)
def steered_text(
    model,
    token_ids: tuple[int, ...],
    num_steps: int,
    vector: np.ndarray | None,
    plane: np.ndarray | None,
    mode: str,
    amount: float,
    steps: tuple[int, int],
    max_new_tokens: int,
    _progress: TaskProgress | None = None,
) -> tuple[str, str]:
    """Greedy continuations without and with the steering hook active during generation; with
    ``_progress`` a bar follows the forwards (the prompt's, then one per token, twice) and every
    block call is a stop point."""
    hooks = _hooks(vector, plane, mode, amount, steps)
    forwards = 2 * (1 + max_new_tokens)
    with threads_for(model), _forwards(model, _progress, forwards, num_steps):
        base, steered = workbench.steered_generation(
            model, torch.tensor(token_ids), max_new_tokens, num_steps, hooks
        )
    if _progress is not None:
        _progress.finish()
    n = len(token_ids)
    tok = model.tokenizer
    return tok.decode(base[0, n:].tolist()), tok.decode(steered[0, n:].tolist())


@cached_analysis(keyed=("model",), max_entries=16)
def ablation(
    model,
    token_ids: tuple[int, ...],
    num_steps: int,
    position: int,
    n_random: int,
    batch_size: int = 33,
    _progress: TaskProgress | None = None,
) -> workbench.AblationResult:
    """The token's rotation plane projected out at every iteration vs ``n_random`` random planes;
    with ``_progress`` a bar follows the planes (and Stop ends them between batches)."""
    with threads_for(model), _forwards(model, _progress):
        result = workbench.ablate_subspace(
            model, list(token_ids), num_steps, position, n_random=n_random,
            batch_size=batch_size, progress=_progress,
        )  # fmt: skip
    if _progress is not None:
        _progress.finish()
    return result


def patches_to_run(
    clean: tuple[int, ...], corrupted: tuple[int, ...], num_steps: int, positions: str
) -> int:
    """Patches a grid runs: positions before the first corrupted token and s_0 are the same in
    both runs, so `workbench.patch_states` skips them; one position set per step for "all"."""
    first = next((i for i, (a, b) in enumerate(zip(clean, corrupted)) if a != b), len(clean))
    return num_steps * (max(len(clean) - first, 1) if positions == "each" else 1)


def patching_plan(
    model, tokens: int, num_steps: int, patches: int
) -> tuple[cost.CostEstimate, int]:
    """The estimated time of a patching grid (the two unpatched runs, then each patch resumed at
    its step) and the patches per batch that keep each batch near `cost.BATCH_SECONDS`."""
    config = model.config
    flops = cost.patching_flops(config, tokens, num_steps, patches, resume=True)
    single = estimate_flops(model, flops, rows=tokens, calls=cost.forward_calls(config, num_steps))
    batch = cost.batch_size_for(single.seconds / (patches + 2), most=64)
    forwards = 2 + math.ceil(patches / batch)
    calls = cost.forward_calls(config, (num_steps + 1) // 2, forwards)
    guess = estimate_flops(model, flops, rows=tokens * batch, calls=calls, action="patching")
    return guess, batch


def ablation_plan(
    model, tokens: int, num_steps: int, n_random: int
) -> tuple[cost.CostEstimate, int]:
    """The estimated time of an ablation with ``n_random`` control planes, and its batch size."""
    config = model.config
    flops = cost.ablation_flops(config, tokens, num_steps, n_random)
    single = estimate_flops(model, flops, rows=tokens)
    batch = cost.batch_size_for(single.seconds / (n_random + 3), most=33)
    calls = cost.forward_calls(config, num_steps, 2 + math.ceil((n_random + 1) / batch))
    guess = estimate_flops(model, flops, rows=tokens * batch, calls=calls, action="ablation")
    return guess, batch


RANDOM_PLANE_CHOICES = (32, 16, 8, 4, 2)


def default_random_planes(model, tokens: int, num_steps: int) -> int:
    """The most control planes (of RANDOM_PLANE_CHOICES) whose ablation fits the time budget."""
    return cost.largest_within(
        RANDOM_PLANE_CHOICES, lambda n: ablation_plan(model, tokens, num_steps, n)[0].seconds
    )
