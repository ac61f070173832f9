"""Stability analyses on stand-in maps with known answers (linear, rotation, flip, contraction)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench
from workbench.explain_dynamics import classify_eigenvalue

H = 10


def linear_map(values: list[complex], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A real (H, H) matrix P D P⁻¹ with the given eigenvalues (complex ones as conjugate pairs) and a b."""
    rng = np.random.default_rng(seed)
    d, i = np.zeros((H, H)), 0
    for v in values:
        if complex(v).imag:
            d[i : i + 2, i : i + 2] = [[v.real, -v.imag], [v.imag, v.real]]
            i += 2
        else:
            d[i, i] = complex(v).real
            i += 1
    assert i == H
    p = rng.standard_normal((H, H))
    a = torch.tensor(p @ d @ np.linalg.inv(p))
    return a, torch.tensor(rng.standard_normal(H))


VALUES = [
    0.9,
    -0.75,
    0.3 + 0.4j,
    0.4,
    0.2,
    -0.1,
    0.05,
    0.02,
    0.01,
]  # moduli 0.9, 0.75, 0.5, 0.5, 0.4, ...
MODULI = [0.9, 0.75, 0.5, 0.5, 0.4]


@pytest.fixture(scope="module")
def affine():
    a, b = linear_map(VALUES)
    return a, b, lambda x: x @ a.T + b


@pytest.mark.parametrize("method", ["anderson", "newton_krylov"])
def test_fixed_point_of_an_affine_map_is_its_solution(affine, method):
    a, b, f = affine
    result = workbench.fixed_point(
        f, state=torch.zeros(H, dtype=torch.float64), method=method, tol=1e-10
    )
    expected = torch.linalg.solve(torch.eye(H, dtype=torch.float64) - a, b)
    assert result.converged and torch.allclose(result.state, expected, atol=1e-7)
    assert float(result.residual) < 1e-10
    if method == "anderson":
        assert result.plain_iterations is not None and result.iterations < result.plain_iterations
        print(f"anderson {result.iterations} passes, plain {result.plain_iterations}")


def test_arnoldi_recovers_the_chosen_eigenvalues(affine):
    _, _, f = affine
    spectrum = workbench.fixed_point_spectrum(
        f, state=torch.zeros(1, H, dtype=torch.float64), position=0, k=5
    )
    assert np.allclose(spectrum["modulus"], MODULI, atol=1e-6)
    assert np.isclose(spectrum["real"].iloc[1], -0.75, atol=1e-6)
    pair = spectrum.iloc[2:4]
    assert np.allclose(sorted(pair["imag"]), [-0.4, 0.4], atol=1e-6)
    assert list(spectrum["index"]) == [1, 2, 3, 4, 5]


def test_lyapunov_exponents_are_log_moduli(affine):
    _, _, f = affine
    frame = workbench.lyapunov_spectrum(
        f, None, 200, k=5, state=torch.zeros(H, dtype=torch.float64)
    )
    assert np.allclose(frame["exponent"], np.log(MODULI), atol=0.01)
    running = frame.attrs["running"]
    assert running.shape == (100, 5) and abs(running[-1, 0] - np.log(0.9)) < 0.01


def test_rotation_in_a_random_plane():
    rng = np.random.default_rng(1)
    basis, _ = np.linalg.qr(rng.standard_normal((H, 2)))
    rho, theta = 1.05, 2 * np.pi / 7
    rot = rho * np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    a = torch.tensor(0.3 * (np.eye(H) - basis @ basis.T) + basis @ rot @ basis.T)
    spectrum = workbench.fixed_point_spectrum(lambda x: x @ a.T, state=torch.zeros(1, H, dtype=torch.float64),
                                              position=0, k=2)  # fmt: skip
    assert np.allclose(spectrum["modulus"], rho, atol=1e-8)
    assert np.allclose(sorted(spectrum["angle"]), [-theta, theta], atol=1e-8)
    period = 2 * np.pi / abs(spectrum["angle"].iloc[0])
    assert period == pytest.approx(7.0)
    assert (
        classify_eigenvalue(complex(spectrum["real"].iloc[0], spectrum["imag"].iloc[0]))
        == "rotation"
    )
    lyap = workbench.lyapunov_spectrum(
        lambda x: x @ a.T, None, 140, k=2, state=torch.ones(H, dtype=torch.float64)
    )
    assert np.allclose(lyap["exponent"], np.log(rho), atol=0.01)


def test_flip_plain_iteration_diverges_anderson_finds_zero():
    a = 1.5
    flip = lambda x: -a * x  # noqa: E731
    start = torch.ones(H, dtype=torch.float64)
    result = workbench.fixed_point(flip, state=start, max_iter=50)
    assert result.converged and float(result.state.abs().max()) < 1e-9
    assert result.plain_iterations is None  # plain iteration flips with growing amplitude
    spectrum = workbench.fixed_point_spectrum(flip, state=result.state[None], position=0, k=3)
    assert np.allclose(spectrum["real"], -a) and np.allclose(spectrum["imag"], 0)
    assert classify_eigenvalue(complex(-a, 0)) == "flip"
    newton = workbench.fixed_point(flip, state=start, method="newton_krylov", plain_baseline=False)
    assert newton.converged and float(newton.state.abs().max()) < 1e-9


def test_contraction_of_known_rate():
    rate, centre = 0.6, torch.linspace(-1, 1, H, dtype=torch.float64)
    shrink = lambda x: centre + rate * (x - centre)  # noqa: E731
    result = workbench.fixed_point(
        shrink, state=torch.full((H,), 5.0, dtype=torch.float64), tol=1e-8
    )
    assert result.converged and torch.allclose(result.state, centre, atol=1e-7)
    # plain iteration: residual ∝ rate^i, so about log(tol)/log(rate) passes
    assert abs(result.plain_iterations - np.log(1e-8 / 10) / np.log(rate)) <= 3
    frame = workbench.lyapunov_spectrum(
        shrink, None, 20, k=3, state=torch.zeros(H, dtype=torch.float64)
    )
    assert np.allclose(frame["exponent"], np.log(rate), atol=1e-9)
    values = workbench.fixed_point_spectrum(shrink, state=result.state[None], position=0, k=2,
                                            singular_values=True)  # fmt: skip
    assert np.allclose(values["singular_value"], rate, atol=1e-8)


def test_no_convergence_is_a_result_not_an_error():
    wander = lambda x: x + 1.0  # noqa: E731  (no fixed point at all)
    result = workbench.fixed_point(wander, state=torch.zeros(H, dtype=torch.float64), max_iter=20)
    assert result.converged is False and result.iterations <= 20 and result.plain_iterations is None


def test_bad_input_is_a_clear_error(affine):
    _, _, f = affine
    one_row = torch.zeros(1, H, dtype=torch.float64)
    with pytest.raises(IndexError, match="out of range"):
        workbench.fixed_point_spectrum(f, state=one_row, position=3, k=2)
    with pytest.raises(ValueError, match="larger than the dimension"):
        workbench.fixed_point_spectrum(f, state=one_row, position=0, k=H + 1)
    with pytest.raises(ValueError, match="larger than the dimension"):
        workbench.lyapunov_spectrum(f, None, 10, position=0, k=H + 1, state=one_row)
    with pytest.raises(ValueError, match="NaN or infinite"):
        workbench.fixed_point(f, state=torch.full((H,), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError, match="needs `state`"):
        workbench.fixed_point(f)
    with pytest.raises(ValueError, match="unknown method"):
        workbench.fixed_point(f, state=one_row[0], method="bisection")
