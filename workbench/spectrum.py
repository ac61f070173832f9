"""The leading eigenvalues (and singular values) of a token's Jacobian block ∂F_t/∂s_t, matrix-free.

Implicitly restarted Arnoldi (``scipy.sparse.linalg.eigs``) on a LinearOperator whose matvec is one JVP
of the token's block map: the k largest-modulus eigenvalues without ever forming the h × h block. At a
fixed point they say why the token behaves as it does: all inside the unit circle = stable (the largest
modulus is the convergence rate), a real one below −1 = a flip, a complex pair outside = a rotation
with period ≈ 2π/angle, one near +1 = a slider. Singular values come from ``svds`` with JVPs and VJPs.
When k ≥ h − 1 (Arnoldi's limit) the block is small enough to read column by column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs, svds
from torch.func import jvp, vjp, vmap

import recurrent_model as rm

from .core_map import StateFn, problems
from .fixed_point import solve


def jacobian_operator(f: StateFn, x: torch.Tensor, adjoint: bool = True) -> LinearOperator:
    """J = ∂f/∂x at x (flattened) as a float64 LinearOperator: matvec a JVP, rmatvec a VJP."""
    shape, dtype, n = x.shape, x.dtype, x.numel()

    def to_torch(v: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(shape)).to(dtype)

    def matvec(v: np.ndarray) -> np.ndarray:
        return jvp(f, (x,), (to_torch(v),))[1].double().flatten().numpy()

    pullback = vjp(f, x)[1] if adjoint else None

    def rmatvec(v: np.ndarray) -> np.ndarray:
        return pullback(to_torch(v))[0].double().flatten().numpy()

    return LinearOperator(
        (n, n), matvec=matvec, rmatvec=rmatvec if adjoint else None, dtype=np.float64
    )


def dense_jacobian(f: StateFn, x: torch.Tensor) -> np.ndarray:
    """The Jacobian of a small map, one JVP per column (only for n ≤ a few hundred)."""
    n = x.numel()
    basis = torch.eye(n, dtype=x.dtype).view(n, *x.shape)
    columns = vmap(lambda v: jvp(f, (x,), (v,))[1].flatten())(basis)
    return columns.double().numpy().T


#: Arnoldi's restarts before it gives up (each restart costs ncv − k JVPs; see :func:`arnoldi_jvps`).
ARNOLDI_RESTARTS = 10


class ArnoldiNoConvergence(RuntimeError):
    """Arnoldi spent its JVP budget before all k eigenvalues met the tolerance.

    ``converged`` holds the eigenvalues that did (largest modulus first, possibly none)."""

    def __init__(self, message: str, converged: np.ndarray) -> None:
        super().__init__(message)
        self.converged = converged


def arnoldi_tolerance(dtype: torch.dtype) -> float:
    """ARPACK's relative tolerance for a map evaluated in ``dtype``: 1e-6, or the dtype's rounding
    unit where that is coarser (a bfloat16 JVP cannot resolve an eigenvalue below its own eps)."""
    return max(1e-6, float(torch.finfo(dtype).eps))


def arnoldi_jvps(k: int, n: int) -> tuple[int, int]:
    """(ncv, budget): the Krylov basis size ARPACK uses for k of n eigenvalues, and the most JVPs
    :func:`leading_eigenvalues` spends: one for the start vector, ncv for the first basis, and
    ``ARNOLDI_RESTARTS`` restarts of ncv − k each."""
    ncv = min(n, max(2 * k + 1, 20))
    return ncv, 1 + ncv + ARNOLDI_RESTARTS * max(ncv - k, 1)


def leading_eigenvalues(f: StateFn, x: torch.Tensor, k: int, seed: int = 0) -> np.ndarray:
    """The k largest-modulus eigenvalues of ∂f/∂x at x, sorted by modulus (descending).

    Arnoldi stops at the tolerance of x's dtype (:func:`arnoldi_tolerance`) or at its JVP budget
    (:func:`arnoldi_jvps`); at the budget it raises :class:`ArnoldiNoConvergence` carrying the
    eigenvalues that did converge, never a silent partial answer."""
    n = x.numel()
    check_k(k, n)
    if k >= n - 1:
        return _by_modulus(np.linalg.eigvals(dense_jacobian(f, x)), k)
    v0 = np.random.default_rng(seed).standard_normal(n)
    operator = jacobian_operator(f, x, adjoint=False)
    tol, (ncv, budget) = arnoldi_tolerance(x.dtype), arnoldi_jvps(k, n)
    try:
        values = eigs(operator, k=k, which="LM", v0=v0, ncv=ncv, tol=tol,
                      maxiter=ARNOLDI_RESTARTS, return_eigenvectors=False)  # fmt: skip
    except ArpackNoConvergence as stop:
        converged = _by_modulus(np.asarray(stop.eigenvalues), k)
        raise ArnoldiNoConvergence(
            f"Arnoldi reached {len(converged)} of {k} eigenvalues to tolerance {tol:.0e} "
            f"({x.dtype}) within its budget of {budget} JVPs (the spectrum is clustered or the "
            "map is not smooth at this point)",
            converged,
        ) from None
    return _by_modulus(values, k)


def _by_modulus(values: np.ndarray, k: int) -> np.ndarray:
    return values[np.argsort(-np.abs(values), kind="stable")][:k]


def leading_singular_values(f: StateFn, x: torch.Tensor, k: int, seed: int = 0) -> np.ndarray:
    """The k largest singular values of ∂f/∂x at x, descending (JVPs and VJPs)."""
    n = x.numel()
    check_k(k, n)
    if k >= n - 1:
        values = np.linalg.svd(dense_jacobian(f, x), compute_uv=False)
    else:
        v0 = np.random.default_rng(seed).standard_normal(n)
        values = svds(jacobian_operator(f, x), k=k, v0=v0, tol=1e-6, return_singular_vectors=False)
    return np.sort(values)[::-1][:k]


def check_k(k: int, n: int) -> None:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > n:
        raise ValueError(f"k = {k} is larger than the dimension of the map (h = {n})")


def eigenvalue_frame(values: np.ndarray) -> pd.DataFrame:
    """index 1 … k, real, imag, modulus, angle (radians) of eigenvalues sorted by modulus."""
    values = np.asarray(values, dtype=complex)
    return pd.DataFrame(
        {
            "index": np.arange(1, len(values) + 1),
            "real": values.real,
            "imag": values.imag,
            "modulus": np.abs(values),
            "angle": np.angle(values),
        }
    )


def reporting(f: StateFn, phase: str, on_pass: Callable[[str, int], None] | None) -> StateFn:
    """``f`` calling ``on_pass(phase, passes so far)`` before each pass (``f`` itself without)."""
    if on_pass is None:
        return f
    count = [0]

    def counted(x: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        on_pass(phase, count[0])
        return f(x)

    return counted


def fixed_point_spectrum(
    model: rm.RecurrentLM | Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor | Sequence[int] | None = None,
    *,
    position: int,
    k: int = 8,
    state: torch.Tensor | None = None,
    num_steps: int | None = None,
    init_scale: float = 0.0,
    tol: float = 1e-5,
    max_iter: int = 500,
    singular_values: bool = False,
    seed: int = 0,
    on_pass: Callable[[str, int], None] | None = None,
) -> pd.DataFrame:
    """The k largest-modulus eigenvalues of ∂F_t/∂s_t at ``state`` (default: the token's fixed point).

    Without ``state`` the token's fixed point is searched for (Anderson) from where the trajectory is
    after ``num_steps`` (default: the mean recurrence), the other positions held there, as
    ``fixed_point(position=...)`` does, starting at that state (the fixed point nearest the run's end).

    Columns ``index``, ``real``, ``imag``, ``modulus``, ``angle``; with ``singular_values`` also
    ``singular_value`` (the k largest, descending, in their own order). ``attrs`` hold the point's
    ``residual`` and, when it was searched for, ``converged`` (a spectrum at a point that is not a
    fixed point describes the map there, not a fixed point's stability), ``arnoldi_tol`` and
    ``eigenvalues_converged``: fewer than k rows when Arnoldi spent its JVP budget, with the reason in
    ``arnoldi_note``. One prompt row at a time.
    ``on_pass(phase, passes)`` is called before every pass of the map (phase "fixed point", then
    "eigenvalues" for Arnoldi's JVPs): an exception it raises ends the computation there (Stop).
    """
    rows, _ = problems(model, input_ids, state, num_steps, init_scale, seed)
    if len(rows) != 1:
        raise ValueError(f"fixed_point_spectrum takes one prompt row, got {len(rows)}")
    p = rows[0]
    p.map.check_position(position)
    check_k(k, p.map.shape[1])
    attrs: dict[str, object] = {}
    context = p.context
    block = p.map.block(position, context)
    point = context[position]
    if state is None:
        found = solve(reporting(block, "fixed point", on_pass), point, "anderson", tol, max_iter)
        point = found.state
        attrs.update(converged=found.converged, iterations=found.passes)
    with torch.no_grad():
        attrs["residual"] = float((block(point) - point).norm() / point.norm().clamp_min(1.0))
    f = reporting(block, "eigenvalues", on_pass)
    attrs.update(arnoldi_tol=arnoldi_tolerance(point.dtype), eigenvalues_converged=k)
    try:
        values = leading_eigenvalues(f, point, k, seed)
    except ArnoldiNoConvergence as partial:
        values = partial.converged
        attrs.update(eigenvalues_converged=len(values), arnoldi_note=str(partial))
    frame = eigenvalue_frame(values)
    if singular_values:
        frame["singular_value"] = leading_singular_values(f, point, k, seed)[: len(frame)]
    frame.attrs.update(attrs)
    frame.attrs["state"] = point.detach().double().numpy()
    return frame
