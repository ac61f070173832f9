"""Lyapunov exponents of the core recurrence along a trajectory (Benettin's QR method), matrix-free.

k orthonormal tangent vectors ride along s_0 … s_r: each iteration maps them by the Jacobian at the
current state (one batched JVP), then QR re-orthonormalises them; log|R_ii| is the i-th vector's
stretch in that step. The exponents are the means of these stretches over the steps after the warm-up
(natural log per core iteration). λ_1 < 0: every direction converges; ≈ 0: marginal (orbits,
sliders); > 0: chaos. At a fixed point they tend to log|eigenvalues| of its Jacobian.
The running mean per step is the convergence diagnostic: a flat tail means the estimate has settled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.func import jvp, vmap

import recurrent_model as rm

from .core_map import StateMap, problems
from .spectrum import check_k


@dataclass(frozen=True)
class LyapunovRun:
    """One Benettin run: exponents (k,) descending, per-step stretches and the running estimate.

    ``stretches`` (num_steps, k) log|R_ii| of every step in QR order; ``running`` (num_steps −
    warmup, k) the mean of the steps after the warm-up up to each step (column 0 is λ_1's);
    ``direction`` the leading tangent vector at ``final_state`` (unit norm, the tangent's shape).
    """

    exponents: np.ndarray
    stretches: np.ndarray
    running: np.ndarray
    warmup: int
    direction: torch.Tensor
    final_state: torch.Tensor


def tangent_images(
    map_: StateMap, state: torch.Tensor, tangents: torch.Tensor, position: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(F(state), J·V) for tangents V (k, ...): the full map's, or the token block's at ``position``."""
    if position is None:
        f, point = map_, state
    else:
        f, point = map_.block(position, state), state[position]
    images = batched_jvp(f, point, tangents)
    with torch.no_grad():
        following = map_(state)
    return following, images


def batched_jvp(
    f: StateMap | Callable, point: torch.Tensor, tangents: torch.Tensor
) -> torch.Tensor:
    """J·v for every tangent v in ``tangents`` (k, ...) at ``point``, as one vmapped JVP."""
    return vmap(lambda v: jvp(f, (point,), (v,))[1])(tangents)


def orthonormal(tangents: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """QR of the k tangents (k, ...): orthonormal tangents of the same shape and log|R_ii|."""
    k = tangents.shape[0]
    q, r = torch.linalg.qr(tangents.reshape(k, -1).double().T)
    stretch = np.log(np.abs(torch.diagonal(r).numpy()))
    return q.T.reshape(tangents.shape).to(tangents.dtype), stretch


def benettin(
    map_: StateMap,
    start: torch.Tensor,
    num_steps: int,
    k: int,
    position: int | None = None,
    warmup: int | None = None,
    seed: int = 0,
    on_step: Callable[[int, int], None] | None = None,
) -> LyapunovRun:
    """k exponents of the trajectory from ``start`` under ``map_`` (the full map or a token block)."""
    num_steps = int(num_steps)
    warmup = num_steps // 2 if warmup is None else int(warmup)
    if num_steps < 1 or not 0 <= warmup < num_steps:
        raise ValueError(
            f"need num_steps >= 1 and 0 <= warmup < num_steps, got {num_steps}, {warmup}"
        )
    tangent_shape = start.shape if position is None else start.shape[1:]
    check_k(k, int(np.prod(tangent_shape)))
    generator = torch.Generator().manual_seed(int(seed))
    noise = torch.randn(k, *tangent_shape, generator=generator, dtype=torch.float64)
    tangents, _ = orthonormal(noise.to(start.dtype))
    state, stretches = start, []
    for step in range(1, num_steps + 1):
        state, images = tangent_images(map_, state, tangents, position)
        tangents, stretch = orthonormal(images)
        stretches.append(stretch)
        if on_step is not None:
            on_step(step, num_steps)
    stretches_arr = np.array(stretches)
    tail = stretches_arr[warmup:]
    running = np.cumsum(tail, axis=0) / np.arange(1, len(tail) + 1)[:, None]
    exponents = np.sort(tail.mean(axis=0))[::-1]
    return LyapunovRun(exponents, stretches_arr, running, warmup, tangents[0].detach(), state)


def lyapunov_run(
    model: rm.RecurrentLM | Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor | Sequence[int] | None,
    num_steps: int,
    *,
    position: int | None = None,
    k: int = 8,
    warmup: int | None = None,
    init_scale: float = 0.0,
    seed: int = 0,
    state: torch.Tensor | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> LyapunovRun:
    """The Benettin run behind :func:`lyapunov_spectrum` (one prompt row)."""
    rows, _ = problems(model, input_ids, state, 0, init_scale, seed)
    if len(rows) != 1:
        raise ValueError(f"lyapunov_spectrum takes one prompt row, got {len(rows)}")
    p = rows[0]
    if position is not None:
        p.map.check_position(position)
    return benettin(p.map, p.start, num_steps, k, position, warmup, seed, on_step)


def lyapunov_spectrum(
    model: rm.RecurrentLM | Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor | Sequence[int] | None,
    num_steps: int,
    *,
    position: int | None = None,
    k: int = 8,
    warmup: int | None = None,
    init_scale: float = 0.0,
    seed: int = 0,
    state: torch.Tensor | None = None,
) -> pd.DataFrame:
    """The k leading Lyapunov exponents of s_0 … s_num_steps, averaged after ``warmup`` steps.

    ``position=None`` the full map (T·h dimensions), an int a token's block (h). Columns ``index``,
    ``exponent`` (natural log per iteration), sorted descending; ``attrs["running"]`` is the running
    estimate (num_steps − warmup, k), column 0 λ_1's. ``model`` may be a plain callable on states,
    with ``state`` its start (for a model, ``state`` replaces s_0).
    """
    run = lyapunov_run(
        model,
        input_ids,
        num_steps,
        position=position,
        k=k,
        warmup=warmup,
        init_scale=init_scale,
        seed=seed,
        state=state,
    )
    frame = pd.DataFrame({"index": np.arange(1, k + 1), "exponent": run.exponents})
    frame.attrs["running"] = run.running
    frame.attrs["warmup"] = run.warmup
    return frame


def token_exponents(
    map_: StateMap, start: torch.Tensor, num_steps: int, warmup: int | None = None, seed: int = 0
) -> np.ndarray:
    """λ_1 of every token's block ∂F_t/∂s_t along the trajectory from ``start``, (T,), in one run.

    Tangent t lives on row t only; one batched JVP of the full map gives J·V, whose row t is the
    block's image (causal attention: the rows before t do not move, the rows after it are dropped).
    """
    num_steps = int(num_steps)
    warmup = num_steps // 2 if warmup is None else int(warmup)
    if num_steps < 1 or not 0 <= warmup < num_steps:
        raise ValueError(
            f"need num_steps >= 1 and 0 <= warmup < num_steps, got {num_steps}, {warmup}"
        )
    T = start.shape[0]
    rows = torch.arange(T)
    generator = torch.Generator().manual_seed(int(seed))
    vectors = torch.randn(T, start.shape[1], generator=generator, dtype=torch.float64).to(
        start.dtype
    )
    vectors = vectors / vectors.norm(dim=-1, keepdim=True)
    state, logs = start, []
    for _ in range(num_steps):
        tangents = torch.zeros(T, *start.shape, dtype=start.dtype)
        tangents[rows, rows] = vectors
        images = batched_jvp(map_, state, tangents)[rows, rows]
        norms = images.double().norm(dim=-1)
        logs.append(norms.log().numpy())
        vectors = (images / norms[:, None].to(images.dtype)).detach()
        with torch.no_grad():
            state = map_(state)
    return np.mean(np.array(logs)[warmup:], axis=0)
