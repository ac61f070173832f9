"""Analyzers on hand-built states with known answers."""

import numpy as np
import pandas as pd
import pytest

import workbench as wb


def _states(*paths):
    """(steps + 1, T, h) from one (steps + 1, h) path per token."""
    return np.stack([np.asarray(p, dtype=np.float64) for p in paths], axis=1)


def test_convergence_known_values():
    z = _states([[1, 0], [2, 0], [4, 0], [4, 0]], [[0, 3]] * 4)
    frame = wb.convergence(z, tokens=["a", "b"])
    a = frame[frame.position == 0].sort_values("step")
    np.testing.assert_allclose(a.distance_to_final, [3, 2, 0, 0])
    np.testing.assert_allclose(a.relative_step.iloc[1:], [0.5, 0.5, 0.0])
    assert np.isnan(a.relative_step.iloc[0]) and set(frame.token) == {"a", "b"}
    b = frame[frame.position == 1]
    np.testing.assert_allclose(b.distance_to_final, 0.0)
    conv = wb.steps_to_converge(frame, eps=0.1).set_index("position")["steps_to_converge"]
    assert conv[0] == 3 and conv[1] == 1
    assert wb.steps_to_converge(frame, eps=1e-9).steps_to_converge.tolist() == [3, 1]
    growing = wb.convergence(_states([[1, 0], [2, 0], [4, 0], [8, 0]]))
    assert pd.isna(wb.steps_to_converge(growing, eps=0.1).steps_to_converge.iloc[0])


def test_convergence_reference():
    z = _states([[1, 0], [2, 0]])
    frame = wb.convergence(z, reference=np.array([[0.0, 2.0]]))
    np.testing.assert_allclose(frame.distance_to_final, [np.sqrt(5), np.sqrt(8)])
    with pytest.raises(ValueError, match="reference"):
        wb.convergence(z, reference=np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"\(steps \+ 1, T, h\)"):
        wb.convergence(z[0])


def test_path_independence_known_spread():
    # Three seeds at one step: (0,0), (3,0), (0,4) -> distances 3, 4, 5 -> mean 4; mean norm 7/3.
    by_seed = np.array([[[[0, 0]]], [[[3, 0]]], [[[0, 4]]]], dtype=float)
    frame = wb.path_independence(by_seed)
    assert len(frame) == 1
    np.testing.assert_allclose(frame.spread, 4 / (7 / 3))
    np.testing.assert_allclose(frame.distance, 4.0)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        wb.path_independence(by_seed[:1])


def _circle(period, steps, phase, h=6, centre=5.0):
    angle = 2 * np.pi * (np.arange(steps) + phase) / period
    x = np.zeros((steps, h))
    x[:, 0], x[:, 1], x[:, 2] = centre + np.cos(angle), np.sin(angle), 1.0
    return x


def test_attractor_distance_is_small_for_a_shared_orbit_with_another_phase():
    a, b = _circle(8, 40, 0), _circle(8, 40, 3)
    fixed_a, fixed_b = (
        np.tile([3.0, 0, 0, 0, 0, 0], (40, 1)),
        np.tile([0, 4.0, 0, 0, 0, 0], (40, 1)),
    )
    by_seed = np.stack([_states(a, fixed_a), _states(b, fixed_b)])
    out = wb.attractor_distance(by_seed, window=8, tokens=["orbit", "fixed"]).set_index("token")
    assert out.loc["orbit", "attractor_distance"] < 1e-9
    spread = wb.path_independence(by_seed)
    last = spread[(spread.position == 0) & (spread.step == 39)].spread.iloc[0]
    assert last > 0.3 and out.loc["orbit", "final_spread"] == pytest.approx(last)
    # Two distinct fixed points: the attractor distance is the plain distance, 5 / mean norm 3.5.
    assert out.loc["fixed", "attractor_distance"] == pytest.approx(5 / 3.5)


def test_step_dynamics_known_values():
    line = [[0, 0], [1, 0], [2, 0], [3, 0]]
    turn = [[0, 0], [1, 0], [1, 1], [0, 1]]
    frame = wb.step_dynamics(_states(line, turn))
    a = frame[frame.position == 0].sort_values("step")
    np.testing.assert_allclose(a.delta_norm.iloc[1:], 1.0)
    np.testing.assert_allclose(a.delta_cosine.iloc[2:], 1.0)
    np.testing.assert_allclose(a.acceleration.iloc[2:], 0.0)
    b = frame[frame.position == 1].sort_values("step")
    np.testing.assert_allclose(b.delta_cosine.iloc[2:], 0.0, atol=1e-12)
    np.testing.assert_allclose(b.acceleration.iloc[2:], [np.sqrt(2) / np.sqrt(2), np.sqrt(2)])
    assert b.acceleration.iloc[:2].isna().all()


def test_token_correlation_collapse_and_anticorrelation():
    rng = np.random.default_rng(0)
    v = rng.normal(size=32)
    collapsed = np.tile(v, (2, 5, 1))
    np.testing.assert_allclose(wb.token_correlation(collapsed).correlation, 1.0)
    opposite = np.stack([np.stack([v, -v])] * 3)
    np.testing.assert_allclose(wb.token_correlation(opposite).correlation, -1.0)
    healthy = rng.normal(size=(3, 64, 512))
    assert (wb.token_correlation(healthy).correlation.abs() < 0.05).all()


def test_token_correlation_matches_training_telemetry():
    """Training telemetry and the workbench report the same number for the same states."""
    import torch

    from pretrain.metrics import token_correlation as logged

    states = np.random.default_rng(3).normal(size=(1, 7, 16)).astype(np.float32)
    states[0, 3] = 0.0  # a zero vector correlates with nothing in both
    expected = wb.token_correlation(states).correlation.iloc[0]
    assert logged(torch.from_numpy(states)) == pytest.approx(expected, rel=1e-5)
