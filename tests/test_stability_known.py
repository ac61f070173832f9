"""Stability analyses on stand-in maps with known answers (linear, rotation, flip, contraction)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

import workbench
import workbench.lyapunov
from workbench.explain_dynamics import classify_eigenvalue
from workbench.lyapunov import token_exponent_table, token_exponents

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


def skewed_rotation(theta: float, rest: float, seed: int = 2) -> torch.Tensor:
    """A rotation by θ in a skewed (non-orthogonal) plane of R^H, ``rest`` × identity elsewhere."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((H, H))
    d = rest * np.eye(H)
    d[:2, :2] = [[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]]
    return torch.tensor(p @ d @ np.linalg.inv(p))


def test_pure_rotation_is_neutral_with_its_error():
    a = skewed_rotation(1.0, 0.5)  # an angle of 1 radian never closes: an invariant circle
    frame = workbench.lyapunov_spectrum(
        lambda x: x @ a.T, None, 200, k=3, state=torch.ones(H, dtype=torch.float64)
    )
    assert list(frame.columns) == ["index", "exponent", "stderr", "neutral"]
    assert (frame["stderr"] >= 0).all() and frame["exponent"].is_monotonic_decreasing
    assert list(frame["neutral"]) == [True, True, False]
    assert np.allclose(frame["exponent"].iloc[:2], 0.0, atol=0.02)
    assert frame["exponent"].iloc[2] == pytest.approx(np.log(0.5), abs=1e-6)
    assert frame.attrs["warmup"] == 100 and frame.attrs["averaged_steps"] == 100


def test_contraction_is_not_neutral():
    rate = 0.6
    shrink = lambda x: rate * x  # noqa: E731
    frame = workbench.lyapunov_spectrum(
        shrink, None, 40, k=3, state=torch.ones(H, dtype=torch.float64)
    )
    assert np.allclose(frame["exponent"], np.log(rate), atol=1e-9)
    assert np.all(frame["stderr"] < 1e-9) and not frame["neutral"].any()


def test_two_cycle_around_an_unstable_fixed_point():
    gains = torch.linspace(1.5, 2.4, H, dtype=torch.float64)
    flip = lambda x: -gains * torch.tanh(x)  # noqa: E731  (0 is a flip: eigenvalues −gains)
    cycle = np.array([brentq(lambda x, g=g: x - g * np.tanh(x), 0.1, 10.0) for g in gains.numpy()])
    expected = np.sort(np.log(gains.numpy() / np.cosh(cycle) ** 2))[::-1]  # per-step multipliers
    frame = workbench.lyapunov_spectrum(
        flip, None, 120, k=4, state=torch.full((H,), 0.3, dtype=torch.float64)
    )
    assert np.allclose(frame["exponent"], expected[:4], atol=1e-6)
    assert (frame["exponent"] < 0).all() and not frame["neutral"].any()
    spectrum = workbench.fixed_point_spectrum(flip, state=torch.zeros(1, H, dtype=torch.float64),
                                              position=0, k=1)  # fmt: skip
    assert classify_eigenvalue(complex(spectrum["real"].iloc[0], 0)) == "flip"


def circle_map(mu: float = 0.3, omega: float = 1.0, rest: float = 0.5):
    """An attracting invariant circle r = 1 in the first plane (angle advancing by ω), ``rest`` elsewhere."""

    def f(x: torch.Tensor) -> torch.Tensor:
        z = torch.complex(x[..., 0], x[..., 1])
        r2 = z.real**2 + z.imag**2
        z = z * complex(np.cos(omega), np.sin(omega)) * (1 + mu) / (1 + mu * r2)
        return torch.cat([z.real[..., None], z.imag[..., None], rest * x[..., 2:]], dim=-1)

    return f


def test_invariant_circle_neutral_and_the_short_average_biased():
    mu = 0.3
    f = circle_map(mu)
    start = torch.full((H,), 0.05, dtype=torch.float64)  # far inside the circle: a long transient
    frame = workbench.lyapunov_spectrum(f, None, 200, k=2, state=start)
    assert list(frame["neutral"]) == [True, False]
    assert frame["exponent"].iloc[1] == pytest.approx(np.log((1 - mu) / (1 + mu)), abs=0.01)
    run = workbench.lyapunov.lyapunov_run(f, None, 32, k=1, warmup=0, state=start)
    check = workbench.lyapunov.convergence_check(run.stretches, 16)
    short, long_ = check["exponent"]
    assert short > 0.05 and abs(long_) < short  # the transient reads as a stretch at 16 steps
    assert list(check["steps"]) == [16, 32]


def test_token_exponent_table_has_errors():
    rot2 = torch.tensor([[np.cos(1.0), -np.sin(1.0)], [np.sin(1.0), np.cos(1.0)]])

    def rows(x: torch.Tensor) -> torch.Tensor:  # row 0 rotates, row 1 contracts (no coupling)
        return torch.stack([x[0] @ rot2.T, 0.6 * x[1]])

    table = token_exponent_table(rows, torch.ones(2, 2, dtype=torch.float64), 60)
    assert list(table.columns) == ["position", "exponent", "stderr", "neutral"]
    assert list(table["neutral"]) == [True, False]
    assert table["exponent"].iloc[1] == pytest.approx(np.log(0.6))
    assert np.allclose(token_exponents(rows, torch.ones(2, 2, dtype=torch.float64), 60),
                       table["exponent"])  # fmt: skip


def test_a_pure_rescaling_contributes_nothing_to_the_relative_attribution():
    from workbench.core_map import SubLayer
    from workbench.stretch_attribution import sublayer_stretches

    rng = np.random.default_rng(3)
    mix = torch.tensor(rng.standard_normal((H, H)) / np.sqrt(H))
    norm = lambda x: x / x.pow(2).mean(-1, keepdim=True).sqrt()  # noqa: E731  (an RMSNorm)

    class StandIn:
        """A map of three pieces: a mixing layer, a pure ×3.5 rescaling, and an RMSNorm."""

        shape = (1, H)

        def __init__(self, scale: float) -> None:
            self.scale = scale

        def sublayers(self) -> list[SubLayer]:
            return [SubLayer("mix", "h.mix", lambda x: torch.tanh(x @ mix.T)),
                    SubLayer("rescale", "h.rescale", lambda x: self.scale * x),
                    SubLayer("norm", "h.norm", norm)]  # fmt: skip

    state, tangent = (torch.tensor(rng.standard_normal((1, H))) for _ in range(2))
    frame = sublayer_stretches(StandIn(3.5), state, tangent, None)
    plain = sublayer_stretches(StandIn(1.0), state, tangent, None)
    assert np.allclose(frame["relative"], plain["relative"], atol=1e-12)  # invariant to the scale
    assert not np.allclose(frame["log_stretch"], plain["log_stretch"])  # the absolute split is not
    rows = frame.set_index("sublayer")
    assert rows.loc["rescale", "relative"] == pytest.approx(0.0, abs=1e-12)
    assert rows.loc["rescale", "log_stretch"] == pytest.approx(np.log(3.5))  # absolute: scale-bound
    assert np.allclose(frame["log_stretch"], frame["relative"] + frame["log_scale"])
    out = norm(3.5 * torch.tanh(state @ mix.T))
    growth = float((out.norm() / state.norm()).log())
    assert frame["relative"].sum() == pytest.approx(frame["log_stretch"].sum() - growth)
    assert list(frame.columns[:4]) == ["sublayer", "hook", "relative", "relative_cumulative"]
