"""Arnoldi's stopping rule: a tolerance the map's dtype can resolve, a bounded JVP budget, and a
partial answer that says it is partial."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench
from workbench import spectrum

N = 200


def counted_orthogonal_map(scale: float, dtype: torch.dtype = torch.float64):
    """x -> scale · Q x for a random orthogonal Q: every eigenvalue has modulus ``scale``, so Arnoldi
    cannot separate the k largest, and a count of its JVPs."""
    q, _ = torch.linalg.qr(
        torch.randn(N, N, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    )
    q = q.to(dtype)
    calls = [0]

    def f(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return scale * (q @ x.reshape(-1)).reshape(x.shape)

    return f, calls


@pytest.mark.parametrize(
    "dtype, tol",
    [
        (torch.float64, 1e-6),
        (torch.float32, 1e-6),
        (torch.bfloat16, 2.0**-7),
        (torch.float16, 2.0**-10),
    ],
)
def test_tolerance_follows_the_dtype(dtype, tol):
    assert spectrum.arnoldi_tolerance(dtype) == pytest.approx(tol)


def test_a_clustered_spectrum_stops_at_the_budget_with_a_named_error():
    f, calls = counted_orthogonal_map(0.5)
    k = 4
    with pytest.raises(
        spectrum.ArnoldiNoConvergence, match=r"of 4 eigenvalues .* budget of \d+ JVPs"
    ) as err:
        spectrum.leading_eigenvalues(f, torch.zeros(N, dtype=torch.float64), k)
    _, budget = spectrum.arnoldi_jvps(k, N)
    assert calls[0] <= budget
    assert np.allclose(np.abs(err.value.converged), 0.5, atol=1e-6)


def test_the_spectrum_frame_keeps_what_converged_and_says_so():
    f, _ = counted_orthogonal_map(0.5)
    frame = workbench.fixed_point_spectrum(
        f, state=torch.zeros(1, N, dtype=torch.float64), position=0, k=4
    )
    assert frame.attrs["eigenvalues_converged"] == len(frame) < 4
    assert "budget" in frame.attrs["arnoldi_note"]
    assert frame.attrs["arnoldi_tol"] == 1e-6


def test_a_separated_spectrum_converges_well_inside_the_budget():
    values = torch.linspace(0.1, 0.9, N, dtype=torch.float64)
    calls = [0]

    def f(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return values * x

    frame = workbench.fixed_point_spectrum(
        f, state=torch.zeros(1, N, dtype=torch.float64), position=0, k=3
    )
    assert np.allclose(frame["modulus"], values[-3:].flip(0).numpy(), atol=1e-6)
    assert frame.attrs["eigenvalues_converged"] == 3 and "arnoldi_note" not in frame.attrs
    assert calls[0] < spectrum.arnoldi_jvps(3, N)[1]
