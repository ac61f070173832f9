"""Fixed points s* = F(s*) of the core map, stable and unstable, by root finding on G(s) = F(s) − s.

Plain iteration only reaches stable fixed points; Anderson acceleration (the default: a least-squares
mix of the last ``memory`` steps) and Newton–Krylov (GMRES on J − I, J applied by JVPs) reach unstable
ones too, e.g. the fixed point a period-2 flip turns around. Every solve also reports how many passes
plain iteration needs to reach the same tolerance, so the gain is visible.

The residual is ‖F(s) − s‖ / max(‖s‖, 1) per position: relative for model states (norms ≫ 1), and
absolute near the origin, so a fixed point at 0 (a stand-in flip) can be found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator, gmres
from torch.func import jvp

import recurrent_model as rm
from recurrent_model.hooked import HookedModel

from .core_map import StateFn, problems

METHODS = ("anderson", "newton_krylov")


@dataclass(frozen=True)
class Solve:
    """One solve of x = f(x): the point, its residual, the core passes spent, converged or not."""

    state: torch.Tensor
    residual: float
    passes: int
    converged: bool


@dataclass(frozen=True)
class FixedPointResult:
    """``state`` (B, T, h) (a stand-in: its own shape), ``residual`` (B, T) ‖F(s) − s‖/max(‖s‖, 1)
    (NaN at positions a per-position solve held fixed), ``iterations`` core passes (a JVP counts as
    one; summed over rows), ``converged`` (every row), ``plain_iterations`` the passes plain iteration
    from the same start needed to reach ``tol`` (None: not within ``max_iter``, or not measured)."""

    state: torch.Tensor
    residual: torch.Tensor
    iterations: int
    converged: bool
    plain_iterations: int | None
    method: str
    position: int | None


def relative_residual(x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
    """‖F(s) − s‖ / max(‖s‖, 1) along the last axis."""
    return (fx - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1.0)


def worst_residual(x: torch.Tensor, fx: torch.Tensor) -> float:
    """The largest per-position residual (NaN or inf when the state blew up)."""
    value = relative_residual(x.double(), fx.double()).max()
    return float(value) if bool(torch.isfinite(value)) else float("inf")


@torch.no_grad()
def anderson(f: StateFn, x0: torch.Tensor, tol: float, max_iter: int, memory: int = 8) -> Solve:
    """Anderson acceleration (type II, mixing 1) of x ↦ f(x); at most ``max_iter`` passes of f."""
    x, fx = x0, f(x0)
    passes, best = 1, (worst_residual(x0, fx), x0)
    d_g: list[torch.Tensor] = []
    d_f: list[torch.Tensor] = []
    prev: tuple[torch.Tensor, torch.Tensor] | None = None
    while True:
        r = worst_residual(x, fx)
        if r < best[0]:
            best = (r, x)
        if r < tol or passes >= max_iter or not np.isfinite(r):
            return Solve(x if r < tol else best[1], min(r, best[0]), passes, r < tol)
        f_flat, g = fx.flatten().double(), (fx - x).flatten().double()
        if prev is not None:
            d_g.append(g - prev[1])
            d_f.append(f_flat - prev[0])
            del d_g[:-memory], d_f[:-memory]
        prev = (f_flat, g)
        step = f_flat
        if d_g:
            gamma = torch.linalg.lstsq(torch.stack(d_g, 1), g[:, None], driver="gelsd").solution
            step = f_flat - (torch.stack(d_f, 1) @ gamma)[:, 0]
        x = step.view(x0.shape).to(x0.dtype)
        fx = f(x)
        passes += 1


def newton_krylov(f: StateFn, x0: torch.Tensor, tol: float, max_iter: int) -> Solve:
    """Newton's method on f(x) − x, each step (J − I) d = −(f(x) − x) by GMRES with JVPs."""
    shape, dtype = x0.shape, x0.dtype
    with torch.no_grad():
        x, fx = x0, f(x0)
    passes = 1
    while True:
        r = worst_residual(x, fx)
        if r < tol or passes >= max_iter or not np.isfinite(r):
            return Solve(x, r, passes, r < tol)
        operator, counter = _newton_operator(f, x)
        rhs = -(fx - x).double().flatten().numpy()
        budget = max(1, min(40, max_iter - passes - 1))
        d, _ = gmres(operator, rhs, rtol=1e-3, restart=budget, maxiter=1)
        passes += counter[0]
        direction = torch.from_numpy(d.reshape(shape)).to(dtype)
        x, fx, spent = _line_search(f, x, direction, r)
        passes += spent


def _newton_operator(f: StateFn, x: torch.Tensor) -> tuple[LinearOperator, list[int]]:
    """J − I at x as a LinearOperator (one JVP per matvec) and a one-element count of its calls."""
    shape, dtype, n = x.shape, x.dtype, x.numel()
    counter = [0]

    def matvec(v: np.ndarray) -> np.ndarray:
        counter[0] += 1
        tangent = torch.from_numpy(np.asarray(v, dtype=np.float64).reshape(shape)).to(dtype)
        jv = jvp(f, (x,), (tangent,))[1]
        return (jv - tangent).double().flatten().numpy()

    return LinearOperator((n, n), matvec=matvec, dtype=np.float64), counter


@torch.no_grad()
def _line_search(
    f: StateFn, x: torch.Tensor, direction: torch.Tensor, r: float
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """x + t·d for the largest t in 1, 1/2, … 1/16 that lowers the residual (else t = 1/16)."""
    t, spent = 1.0, 0
    while True:
        trial = x + t * direction
        f_trial = f(trial)
        spent += 1
        if worst_residual(trial, f_trial) < r or t <= 1 / 16:
            return trial, f_trial, spent
        t /= 2


@torch.no_grad()
def plain_passes(f: StateFn, x0: torch.Tensor, tol: float, max_iter: int) -> int | None:
    """Passes of plain iteration x ← f(x) until the residual is below ``tol`` (None: not by max_iter)."""
    x = x0
    for passes in range(1, max_iter + 1):
        fx = f(x)
        r = worst_residual(x, fx)
        if r < tol:
            return passes
        if not np.isfinite(r):
            return None
        x = fx
    return None


def solve(
    f: StateFn, x0: torch.Tensor, method: str, tol: float, max_iter: int, memory: int = 8
) -> Solve:
    """Root-find x = f(x) from x0 with ``method``."""
    if method == "anderson":
        return anderson(f, x0, tol, max_iter, memory)
    if method == "newton_krylov":
        return newton_krylov(f, x0, tol, max_iter)
    raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")


def fixed_point(
    model: rm.RecurrentLM | Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor | Sequence[int] | None = None,
    *,
    position: int | None = None,
    method: str = "anderson",
    tol: float = 1e-5,
    max_iter: int = 500,
    num_steps: int | None = None,
    init_scale: float = 0.0,
    state: torch.Tensor | None = None,
    memory: int = 8,
    plain_baseline: bool = True,
    seed: int = 0,
) -> FixedPointResult:
    """A fixed point of the core map for the whole sequence (``position=None``) or one token.

    Starts from s_0 (``init_scale``, ``seed``) or from ``state``. A token's solve moves only its row;
    the other positions stay at ``state``, or at s_num_steps of the trajectory (default: the mean
    recurrence). ``model`` may be a plain callable on (T, h) or (h,) tensors (then ``state`` is
    required). No convergence within ``max_iter`` passes is ``converged=False``, not an error.
    ``plain_baseline`` also runs plain iteration (up to ``max_iter`` passes) for comparison.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    if tol <= 0 or max_iter < 1:
        raise ValueError(f"tol must be > 0 and max_iter >= 1, got tol={tol}, max_iter={max_iter}")
    rows, flat = problems(model, input_ids, state, num_steps, init_scale, seed)
    states, residuals, passes, plain, converged = [], [], 0, [], True
    for p in rows:
        if position is None:
            f, start = p.map, p.start
        else:
            p.map.check_position(position)
            f, start = p.map.block(position, p.context), p.start[position]
        result = solve(f, start, method, tol, max_iter, memory)
        passes += result.passes
        converged &= result.converged
        if plain_baseline:
            plain.append(plain_passes(f, start, tol, max_iter))
        full, residual = _place(p.context, result.state, position, f)
        states.append(full)
        residuals.append(residual)
    plain_total = None if not plain_baseline or None in plain else sum(plain)
    state_out = torch.stack(states)
    residual_out = torch.stack(residuals)
    if flat:
        state_out, residual_out = state_out[0, 0], residual_out[0, 0]
    elif not isinstance(model, HookedModel):
        state_out, residual_out = state_out[0], residual_out[0]
    return FixedPointResult(
        state_out, residual_out, passes, bool(converged), plain_total, method, position
    )


@torch.no_grad()
def _place(
    context: torch.Tensor, found: torch.Tensor, position: int | None, f: StateFn
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full (T, h) state and its per-position residual (NaN where a token solve held rows)."""
    if position is None:
        return found, relative_residual(found.double(), f(found).double()).float()
    full = context.clone()
    full[position] = found
    residual = torch.full((context.shape[0],), float("nan"))
    residual[position] = relative_residual(found.double(), f(found).double()).float()
    return full, residual
