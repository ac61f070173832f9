"""Lyapunov exponents of the core recurrence along a trajectory (Benettin's QR method), matrix-free.

k orthonormal tangent vectors ride along s_0 … s_r: each iteration maps them by the Jacobian at the
current state (one batched JVP), then QR re-orthonormalises them; log|R_ii| is the i-th vector's
stretch in that step. The exponents are the means of these stretches over the steps after the warm-up
(natural log per core iteration). λ_1 < 0: every direction converges; ≈ 0: marginal (orbits,
sliders); > 0: chaos. At a fixed point they tend to log|eigenvalues| of its Jacobian.
The running mean per step is the convergence diagnostic: a flat tail means the estimate has settled.

Every exponent carries a standard error from batch means: the steps after the warm-up (the discarded
transient) are cut into consecutive blocks, and the spread of the block means over √(blocks) is the
error of their mean. An exponent within ``NEUTRAL_Z`` errors of 0 (or within ``NEUTRAL_FLOOR``) is
*neutral*: a rotation on an invariant circle, a slow slider, or a fixed point with an eigenvalue on the
unit circle. A finite average over few steps reads such a direction as slightly negative (the tangent's
bounded transient divided by the number of steps); the error says how far that reading can be trusted.
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
from .token_block_jvp import token_block_images

#: An exponent within this many standard errors of 0 is neutral.
NEUTRAL_Z = 2.0
#: An exponent this close to 0 is neutral whatever its error (rounding of an exact isometry).
NEUTRAL_FLOOR = 1e-6
#: Most blocks the averaged steps are cut into for the batch-means error.
MAX_BATCHES = 8


@dataclass(frozen=True)
class LyapunovRun:
    """One Benettin run: exponents (k,) descending, per-step stretches and the running estimate.

    ``stretches`` (num_steps, k) log|R_ii| of every step in QR order; ``running`` (num_steps −
    warmup, k) the mean of the steps after the warm-up up to each step (column 0 is λ_1's);
    ``direction`` the leading tangent vector at ``final_state`` (unit norm, the tangent's shape);
    ``stderr`` (k,) the batch-means standard error of each exponent, in the same order.
    """

    exponents: np.ndarray
    stretches: np.ndarray
    running: np.ndarray
    warmup: int
    direction: torch.Tensor
    final_state: torch.Tensor
    stderr: np.ndarray | None = None

    @property
    def neutral(self) -> np.ndarray:
        """(k,) bool: each exponent within its error of 0."""
        return is_neutral(self.exponents, self.stderr_or_nan)

    @property
    def stderr_or_nan(self) -> np.ndarray:
        if self.stderr is None:
            return np.full(len(self.exponents), np.nan)
        return self.stderr


def batch_means(tail: np.ndarray, batches: int | None = None) -> np.ndarray:
    """(B, ...) means of B equal consecutive blocks of ``tail`` (n, ...); the oldest remainder dropped.

    B defaults to ⌊√n⌋ clipped to [2, MAX_BATCHES]; fewer than 2 steps give an empty (0, ...) array.
    """
    n = len(tail)
    if batches is None:
        batches = int(np.clip(int(np.sqrt(n)), 2, MAX_BATCHES))
    if n < 2 or batches < 2:
        return np.empty((0, *tail.shape[1:]))
    batches = min(batches, n)
    length = n // batches
    kept = tail[n - batches * length :]
    return kept.reshape(batches, length, *tail.shape[1:]).mean(axis=1)


def standard_error(tail: np.ndarray, batches: int | None = None) -> np.ndarray:
    """Batch-means standard error of ``tail.mean(axis=0)``; NaN with fewer than 2 steps."""
    means = batch_means(np.asarray(tail, dtype=np.float64), batches)
    if len(means) < 2:
        return np.full(tail.shape[1:], np.nan)
    return means.std(axis=0, ddof=1) / np.sqrt(len(means))


def is_neutral(exponents: np.ndarray, stderr: np.ndarray, z: float = NEUTRAL_Z) -> np.ndarray:
    """|exponent| ≤ max(z · stderr, NEUTRAL_FLOOR); a NaN error makes only the floor count."""
    bound = np.fmax(z * np.asarray(stderr, dtype=np.float64), NEUTRAL_FLOOR)
    return np.abs(np.asarray(exponents, dtype=np.float64)) <= bound


def check_steps(num_steps: int, warmup: int | None) -> tuple[int, int]:
    """(num_steps, warmup) as ints, warm-up defaulting to half; a bad pair is a one-line error."""
    num_steps = int(num_steps)
    warmup = num_steps // 2 if warmup is None else int(warmup)
    if num_steps < 1 or not 0 <= warmup < num_steps:
        raise ValueError(
            f"need num_steps >= 1 and 0 <= warmup < num_steps, got {num_steps}, {warmup}"
        )
    return num_steps, warmup


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
    num_steps, warmup = check_steps(num_steps, warmup)
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
    order = np.argsort(-tail.mean(axis=0), kind="stable")
    exponents, stderr = tail.mean(axis=0)[order], standard_error(tail)[order]
    direction = tangents[0].detach()
    return LyapunovRun(exponents, stretches_arr, running, warmup, direction, state, stderr)


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
    return spectrum_frame(run)


def spectrum_frame(run: LyapunovRun) -> pd.DataFrame:
    """A run's exponents as ``index``, ``exponent``, ``stderr``, ``neutral``, with its running estimate
    (``attrs["running"]``), the discarded transient (``attrs["warmup"]``) and the steps averaged."""
    k = len(run.exponents)
    frame = pd.DataFrame({"index": np.arange(1, k + 1), "exponent": run.exponents,
                          "stderr": run.stderr_or_nan, "neutral": run.neutral})  # fmt: skip
    frame.attrs["running"] = run.running
    frame.attrs["warmup"] = run.warmup
    frame.attrs["averaged_steps"] = len(run.stretches) - run.warmup
    return frame


def estimate(stretches: np.ndarray, warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, batch-means standard error) of the per-step stretches (n, ...) after ``warmup``."""
    tail = np.asarray(stretches)[warmup:]
    return tail.mean(axis=0), standard_error(tail)


def convergence_check(stretches: np.ndarray, num_steps: int) -> pd.DataFrame:
    """λ estimates at ``num_steps`` and at twice that, from one run of 2·``num_steps`` stretches.

    Each estimate discards the first half of its steps. One row per (``steps``, column of the
    stretches): ``steps``, ``index``, ``exponent``, ``stderr``, ``neutral``; ``attrs["agree"]`` (k,)
    says whether the two estimates lie within ``NEUTRAL_Z`` combined errors of each other.
    """
    stretches = np.asarray(stretches).reshape(len(stretches), -1)
    if len(stretches) < 2 * num_steps:
        raise ValueError(f"need {2 * num_steps} steps of stretches, got {len(stretches)}")
    rows, found = [], []
    for steps in (num_steps, 2 * num_steps):
        mean, err = estimate(stretches[:steps], steps // 2)
        found.append((mean, err))
        for i, (m, e) in enumerate(zip(mean, err)):
            rows.append({"steps": steps, "index": i + 1, "exponent": m, "stderr": e,
                         "neutral": bool(is_neutral(m, e))})  # fmt: skip
    frame = pd.DataFrame(rows)
    (m1, e1), (m2, e2) = found
    frame.attrs["agree"] = np.abs(m1 - m2) <= NEUTRAL_Z * np.hypot(e1, e2)
    return frame


def token_stretches(
    map_: StateMap, start: torch.Tensor, num_steps: int, seed: int = 0
) -> np.ndarray:
    """(num_steps, T) per-step log-stretch of every token's block ∂F_t/∂s_t from ``start``.

    A model's map (rows meeting only in causal attention, :attr:`StateMap.causal_rows`) gives every
    block's image from one JVP (:func:`token_block_images`, checked on the first and the last
    token at the first step). Any other map: tangent t on row t only, T of them in one batched JVP
    of the full map, whose row t of image t is the block's image.
    """
    T = start.shape[0]
    rows = torch.arange(T)
    generator = torch.Generator().manual_seed(int(seed))
    vectors = torch.randn(T, start.shape[1], generator=generator, dtype=torch.float64).to(
        start.dtype
    )
    vectors = vectors / vectors.norm(dim=-1, keepdim=True)
    one_pass = getattr(map_, "causal_rows", False)  # a plain function serves as a map too
    state, logs = start, []
    for step in range(int(num_steps)):
        if one_pass:
            images = token_block_images(map_, state, vectors, check=step == 0)
        else:
            tangents = torch.zeros(T, *start.shape, dtype=start.dtype)
            tangents[rows, rows] = vectors
            images = batched_jvp(map_, state, tangents)[rows, rows]
        norms = images.double().norm(dim=-1)
        logs.append(norms.log().numpy())
        vectors = (images / norms[:, None].to(images.dtype)).detach()
        with torch.no_grad():
            state = map_(state)
    return np.array(logs)


def token_exponents(
    map_: StateMap, start: torch.Tensor, num_steps: int, warmup: int | None = None, seed: int = 0
) -> np.ndarray:
    """λ_1 of every token's block ∂F_t/∂s_t along the trajectory from ``start``, (T,), in one run."""
    num_steps, warmup = check_steps(num_steps, warmup)
    return token_stretches(map_, start, num_steps, seed)[warmup:].mean(axis=0)


def token_exponent_table(
    map_: StateMap, start: torch.Tensor, num_steps: int, warmup: int | None = None, seed: int = 0
) -> pd.DataFrame:
    """Every token's block λ_1 with its error: ``position``, ``exponent``, ``stderr``, ``neutral``.

    ``attrs["warmup"]`` is the discarded transient; :func:`token_stretches` gives the per-step
    stretches, from which :func:`convergence_check` compares the estimate at half the steps.
    """
    num_steps, warmup = check_steps(num_steps, warmup)
    stretches = token_stretches(map_, start, num_steps, seed)
    mean, err = estimate(stretches, warmup)
    frame = pd.DataFrame({"position": np.arange(len(mean)), "exponent": mean, "stderr": err,
                          "neutral": is_neutral(mean, err)})  # fmt: skip
    frame.attrs.update(warmup=warmup, averaged_steps=num_steps - warmup)
    return frame
