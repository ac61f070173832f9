"""Tests of workbench.classify_dynamics on the synthetic benchmark and hand-built trajectories."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import PCA

from recurrent_model.standin import DEFAULT_CHECKPOINT
from workbench import classify_dynamics
from workbench.dynamics import (
    KINDS,
    default_tail,
    rotation_plane,
    rotation_planes,
    transient_windows,
)
from workbench.dynamics_features import drift_features, tail_pca
from workbench.synthetic import SUBTYPES, make_benchmark, make_set, rms_normalise
from workbench.synthetic_holdout import HOLDOUT_SUBTYPES, make_holdout

H = 64


@pytest.fixture(scope="module")
def benchmark() -> pd.DataFrame:
    """Labels and predictions of the committed benchmark (seed 0), one row per token."""
    frames = []
    for s in make_benchmark(seed=0, repeats=2):
        pred = classify_dynamics(s.states).reset_index(drop=True)
        pred = pred[["kind", "period"]].add_suffix("_pred")
        frames.append(pd.concat([s.labels, pred], axis=1))
    return pd.concat(frames, ignore_index=True)


def _plane(rng: np.random.Generator, n: int = 2) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((H, n)))[0].T


def _circle(period: float, steps: int = 64, radius: float = 2.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, v = _plane(rng)
    angle = 2 * np.pi * np.arange(steps + 1) / period
    return rng.standard_normal(H) + radius * (
        np.outer(np.cos(angle), u) + np.outer(np.sin(angle), v)
    )


def test_benchmark_kind_accuracy(benchmark: pd.DataFrame) -> None:
    acc = (benchmark.kind == benchmark.kind_pred).mean()
    assert acc >= 0.95, pd.crosstab(benchmark.kind, benchmark.kind_pred)


@pytest.mark.parametrize("kind", KINDS)
def test_benchmark_accuracy_per_kind(benchmark: pd.DataFrame, kind: str) -> None:
    rows = benchmark[benchmark.kind == kind]
    assert len(rows) >= 20
    assert (rows.kind_pred == kind).mean() >= 0.95, rows.kind_pred.value_counts()


def test_benchmark_covers_every_subtype(benchmark: pd.DataFrame) -> None:
    seen = set(zip(benchmark.kind, benchmark.subtype))
    assert seen == {(k, s) for k, subs in SUBTYPES.items() for s in subs}
    assert benchmark.noise.nunique() >= 3 and benchmark.h.nunique() >= 3


def test_benchmark_period_error(benchmark: pd.DataFrame) -> None:
    orbits = benchmark[(benchmark.kind == "orbit") & (benchmark.kind_pred == "orbit")]
    err = (orbits.period_pred / orbits.period - 1).abs()
    assert orbits.period.min() < 5 and orbits.period.max() > 55
    assert err.median() <= 0.05 and err.quantile(0.95) <= 0.05, err.describe()
    assert err.max() <= 0.05, err.describe()


def test_columns_and_blanks() -> None:
    s = make_benchmark(seed=1, repeats=1, sizes=((64, H),))[0]
    df = classify_dynamics(s.states)
    assert list(df.index) == list(range(s.states.shape[1]))
    assert list(df.token) == [str(i) for i in df.index]
    words = [f"w{i}" for i in df.index]
    assert list(classify_dynamics(s.states, tokens=words).token) == words
    for col in ("kind", "period", "angular_speed", "drift_speed", "final_step_size"):
        assert col in df.columns
    assert set(df.kind) <= set(KINDS)
    orbit = df.kind == "orbit"
    assert df.period[orbit].notna().all() and df.period[~orbit].isna().all()
    assert np.allclose(df.period[orbit] * df.angular_speed[orbit], 2 * np.pi)
    slider = df.kind == "slider"
    assert df.drift_speed[slider].gt(0).all() and df.drift_speed[~slider].isna().all()
    assert df.drift_direction_share[slider].between(0, 1).all()


def test_orbit_period_speed_and_plane() -> None:
    traj = _circle(period=12.5)
    row = classify_dynamics(traj[:, None, :]).iloc[0]
    assert row.kind == "orbit"
    assert row.period == pytest.approx(12.5, rel=1e-3)
    assert row.angular_speed == pytest.approx(2 * np.pi / 12.5, rel=1e-3)
    assert row.plane_variance_share > 0.99
    plane = rotation_plane(traj)
    true_plane = _plane(np.random.default_rng(0))  # the plane _circle(seed=0) drew
    assert plane.shape == (2, H)
    assert np.allclose(plane @ plane.T, np.eye(2), atol=1e-8)
    # the fitted plane spans the true one: all principal cosines are 1
    assert np.allclose(np.linalg.svd(plane @ true_plane.T, compute_uv=False), 1, atol=1e-6)


@pytest.mark.parametrize("period", [2.0, 2.5, 3.0, 7.0, 30.0])
def test_orbit_periods_including_aliasing(period: float) -> None:
    row = classify_dynamics(_circle(period)[:, None, :], tail=64).iloc[0]
    assert row.kind == "orbit"
    assert row.period == pytest.approx(period, rel=1e-3)


def test_orbit_needs_a_revolution_in_the_tail() -> None:
    traj = _circle(period=60)[:, None, :]
    assert classify_dynamics(traj, tail=32).kind.iloc[0] != "orbit"
    assert classify_dynamics(traj, tail=64).kind.iloc[0] == "orbit"


def test_slider_speed_and_direction() -> None:
    rng = np.random.default_rng(1)
    d = _plane(rng, 1)[0]
    traj = rng.standard_normal(H) * 5 + 0.05 * np.outer(np.arange(65), d)
    row = classify_dynamics(traj[:, None, :]).iloc[0]
    assert row.kind == "slider"
    assert row.drift_speed == pytest.approx(0.05, rel=1e-6)
    assert row.drift_direction_share == pytest.approx(1.0, abs=1e-9)
    assert row.straightness == pytest.approx(1.0, abs=1e-9)


def test_fixed_point_and_final_step_size() -> None:
    rng = np.random.default_rng(2)
    c, d = rng.standard_normal(H), rng.standard_normal(H)
    traj = c + np.outer(0.9 ** np.arange(65), d)
    row = classify_dynamics(traj[:, None, :]).iloc[0]
    assert row.kind == "fixed_point"
    expected = np.linalg.norm(traj[-1] - traj[-2]) / np.linalg.norm(traj[-1])
    assert row.final_step_size == pytest.approx(expected, rel=1e-9)
    assert np.isnan(row.period) and np.isnan(row.drift_speed)


def test_random_walk_is_other() -> None:
    rng = np.random.default_rng(3)
    walks = rms_normalise(5 + np.cumsum(rng.normal(0, 0.02, size=(97, 8, H)), axis=0))
    assert (classify_dynamics(walks).kind == "other").all()


def test_thresholds_are_keyword_arguments() -> None:
    rng = np.random.default_rng(4)
    traj = (rng.standard_normal(H) + 0.01 * np.outer(np.arange(65), rng.standard_normal(H)))[
        :, None, :
    ]
    assert classify_dynamics(traj).kind.iloc[0] == "slider"
    assert classify_dynamics(traj, fixed_tol=1.0).kind.iloc[0] == "fixed_point"
    no_slider = dict(min_straightness=1.01, min_pc_straightness=1.01)
    assert classify_dynamics(traj, **no_slider).kind.iloc[0] == "other"
    with pytest.raises(TypeError):
        classify_dynamics(traj, no_such_threshold=1.0)


def test_tail_selects_the_window() -> None:
    """A drift that turns into an orbit: the tail sees the orbit, the whole run does not."""
    traj = _circle(period=8, steps=128, radius=0.5)
    drift = 0.2 * _plane(np.random.default_rng(9), 1)[0]
    traj[:64] = traj[64] + np.outer(np.arange(-64, 0), drift)
    assert classify_dynamics(traj[:, None, :], tail=32).kind.iloc[0] == "orbit"
    assert classify_dynamics(traj[:, None, :], tail=128).kind.iloc[0] != "orbit"


def test_default_tail() -> None:
    assert default_tail(64) == 32 and default_tail(20) == 16 and default_tail(10) == 10


def test_zero_and_constant_trajectories() -> None:
    states = np.zeros((33, 2, H))
    states[:, 1] = 1.5
    df = classify_dynamics(states)
    assert (df.kind == "fixed_point").all()
    assert (df.final_step_size == 0).all()


@pytest.mark.parametrize(
    "states, message",
    [
        (np.full((33, 1, H), np.nan), "NaN"),
        (np.zeros((5, 1, H)), "at least"),
        (np.zeros((33, H)), "steps \\+ 1, T, h"),
    ],
)
def test_invalid_input_raises(states: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        classify_dynamics(states)


def test_tail_longer_than_run_raises() -> None:
    with pytest.raises(ValueError, match="longer"):
        classify_dynamics(np.zeros((17, 1, H)), tail=20)


def test_generator_is_deterministic_and_normalised() -> None:
    a = make_set(
        [("orbit", "quasi", 0.01), ("slider", "curved", 0.0)], 64, H, np.random.default_rng(7)
    )
    b = make_set(
        [("orbit", "quasi", 0.01), ("slider", "curved", 0.0)], 64, H, np.random.default_rng(7)
    )
    assert a.states.shape == (65, 2, H)
    assert np.array_equal(a.states, b.states) and a.labels.equals(b.labels)
    assert np.allclose(np.sqrt(np.mean(a.states**2, axis=-1)), 1.0)
    assert a.labels.period.iloc[0] >= 4 and np.isnan(a.labels.period.iloc[1])


def test_rotation_planes_match_per_token_and_float16_input() -> None:
    states = np.stack([_circle(9.0, seed=1), _circle(15.0, seed=2)], axis=1)
    planes = rotation_planes(states)
    assert planes.shape == (2, 2, H)
    for i in range(2):
        single = rotation_plane(states[:, i])
        assert np.allclose(np.linalg.svd(planes[i] @ single.T, compute_uv=False), 1, atol=1e-8)
    half = classify_dynamics(states.astype(np.float16))
    assert list(half.kind) == ["orbit", "orbit"]
    assert np.allclose(half.period, [9.0, 15.0], rtol=0.01)


def test_no_tokens_gives_an_empty_frame() -> None:
    df = classify_dynamics(np.zeros((33, 0, H)))
    assert len(df) == 0 and {"kind", "period", "final_step_size"} <= set(df.columns)
    assert rotation_planes(np.zeros((33, 0, H))).shape == (0, 2, H)


def test_gram_based_features_match_direct_computation() -> None:
    rng = np.random.default_rng(12)
    tails = np.cumsum(rng.standard_normal((3, 33, H)), axis=1)
    pca = tail_pca(tails, 8)
    centred = tails - tails.mean(axis=1, keepdims=True)
    # PCA: scores reproduce the projections on the top components, total variance is exact
    comps = pca.components(tails)
    assert np.allclose(pca.scores, centred @ np.swapaxes(comps, 1, 2))
    assert np.allclose(pca.total, np.sum(centred**2, axis=(1, 2)))
    top = PCA(8).fit(centred[0])
    assert np.allclose(np.abs(comps[0]), np.abs(top.components_), atol=1e-8)
    # drift: least-squares velocity and coarse straightness, recomputed directly
    f = drift_features(pca)
    t = np.arange(33) - 16.0
    beta = np.einsum("n,tnh->th", t, centred) / np.sum(t**2)
    assert np.allclose(f["drift_velocity_norm"], np.linalg.norm(beta, axis=1))
    idx = np.arange(0, 33, 4)
    coarse = tails[:, idx]
    path = np.linalg.norm(np.diff(coarse, axis=1), axis=2).sum(axis=1)
    net = np.linalg.norm(coarse[:, -1] - coarse[:, 0], axis=1)
    assert np.allclose(f["straightness"], net / path)


@pytest.mark.parametrize("shape", ["limacon", "rounded_square"])
def test_non_elliptic_closed_loops_are_orbits(shape: str) -> None:
    rng = np.random.default_rng(13)
    theta = 2 * np.pi * np.arange(97) / 19.0
    if shape == "limacon":
        loop = np.stack(
            [np.cos(theta) + 0.5 * np.cos(2 * theta), np.sin(theta) + 0.5 * np.sin(2 * theta)], 1
        )
    else:
        loop = (
            np.sign(np.stack([np.cos(theta), np.sin(theta)], 1))
            * np.abs(np.stack([np.cos(theta), np.sin(theta)], 1)) ** 0.3
        )
    traj = rng.standard_normal(H) + 2.0 * loop @ _plane(rng)
    row = classify_dynamics(traj[:, None, :]).iloc[0]
    assert row.kind == "orbit"
    assert row.period == pytest.approx(19.0, rel=0.01)


def test_figure_eight_is_not_an_orbit() -> None:
    """A figure-eight closes but does not rotate: its angle goes back and forth."""
    rng = np.random.default_rng(14)
    theta = 2 * np.pi * np.arange(97) / 19.0
    traj = rng.standard_normal(H) + 2.0 * np.stack([np.cos(theta), np.sin(2 * theta)], 1) @ _plane(
        rng
    )
    assert classify_dynamics(traj[:, None, :]).kind.iloc[0] != "orbit"


def test_heldout_family_accuracy() -> None:
    """A generator family built differently (warped speeds, skew ellipses, tori, spiral-in
    transients, Student-t noise, ln_f weights), never used to choose thresholds: seed 2000."""
    frames = []
    for s in make_holdout(seed=2000, repeats=1):
        pred = classify_dynamics(s.states).reset_index(drop=True)
        frames.append(
            pd.concat([s.labels, pred[["kind", "period", "flip"]].add_suffix("_pred")], axis=1)
        )
    r = pd.concat(frames, ignore_index=True)
    assert set(zip(r.kind, r.subtype)) == {
        (k, s) for k, subs in HOLDOUT_SUBTYPES.items() for s in subs
    }
    hit = r.kind == r.kind_pred
    assert hit.mean() >= 0.98, r[~hit][["kind", "subtype", "noise", "steps", "kind_pred"]]
    orbits = r[(r.kind == "orbit") & hit]
    assert (orbits.flip_pred == (orbits.subtype == "flip")).all()
    assert ((orbits.period_pred / orbits.period - 1).abs() <= 0.05).all()


def _with_transient(
    traj: np.ndarray, scale: float = 6.0, q: float = 0.8, seed: int = 3
) -> np.ndarray:
    d = np.random.default_rng(seed).standard_normal(traj.shape[1])
    return traj + scale * np.outer(q ** np.arange(len(traj)), d / np.linalg.norm(d))


@pytest.mark.parametrize("period", [40.0, 44.0, 48.0])
def test_long_period_orbit_window_starts_after_the_transient(period: float) -> None:
    """Periods of 60–75 % of a 64-step run: the fixed half-run tail holds < 0.8 turns, the window
    after the transient holds more."""
    traj = _with_transient(_circle(period, steps=64))[:, None, :]
    row = classify_dynamics(traj).iloc[0]
    assert row.kind == "orbit" and row.period == pytest.approx(period, rel=0.02)
    assert row.window > 0.8 * period and 0 < row.window_start < 32
    assert classify_dynamics(traj, tail=32).kind.iloc[0] != "orbit"  # an explicit tail is kept


def test_transient_end_tracks_the_decay() -> None:
    """A transient 20 q^t off the plane of a radius-2 circle ends (+2 steps margin) when the state
    comes within 1.5 radii of the orbit's centre: sqrt(4 + 400 q^2t) <= 3."""
    qs = (0.5, 0.8, 0.9)
    runs = [_with_transient(_circle(12.0), scale=20.0, q=q) for q in qs]
    starts = 64 - transient_windows(np.stack(runs, axis=1), 16)
    t = np.arange(65)
    expected = [np.flatnonzero(np.sqrt(4 + 400 * q ** (2 * t)) > 3).max() + 3 for q in qs]
    assert np.all(np.abs(starts - expected) <= 2) and np.all(np.diff(starts) > 0), (
        starts,
        expected,
    )
    clean = classify_dynamics(_circle(45.0)[:, None, :]).iloc[0]
    assert clean.window_start == 0 and clean.kind == "orbit"


def test_period_two_flip_is_flagged() -> None:
    rng = np.random.default_rng(4)
    centre, u = rng.standard_normal(H), _plane(rng, 1)[0]
    sign = (-1.0) ** np.arange(65)
    flip = centre + np.outer(sign, u)
    damped = centre + np.outer(sign * 0.85 ** np.arange(65), u)
    df = classify_dynamics(np.stack([flip, _circle(7.0), damped], axis=1))
    assert list(df.kind) == ["orbit", "orbit", "fixed_point"]
    assert list(df.flip) == [True, False, False]
    assert df.period.iloc[0] == pytest.approx(2.0, rel=1e-3)


def _dying_flip(steps: int = 32, q: float = 0.93, seed: int = 5) -> np.ndarray:
    """A token like the default checkpoint's "many" at 32 steps: a fast transient gone by step ~19,
    then a period-2 alternation whose amplitude falls by q per step, wobbling from step to step
    (so the step norms fit no clean log-linear line)."""
    rng = np.random.default_rng(seed)
    centre, u, v = rng.standard_normal(H), *_plane(rng)
    t = np.arange(steps + 1)
    flip = 0.3 * q**t * np.exp(0.3 * rng.standard_normal(steps + 1)) * (-1.0) ** t
    jitter = 0.0005 * rng.standard_normal((steps + 1, H))
    return centre + np.outer(4 * 0.6**t, u) + np.outer(flip, v) + jitter


def test_a_dying_alternation_is_a_fixed_point_that_has_not_settled() -> None:
    """A short transient is never an orbit: the alternation decays (its step norms alternate, so
    their log-linear fit is poor), and the steps are still above fixed_tol."""
    df = classify_dynamics(np.stack([_dying_flip(seed=s) for s in range(8)], axis=1))
    assert (df.kind == "fixed_point").all(), df[["kind", "flip", "step_decay", "contraction_fit"]]
    assert not df.settled.any() and (df.tail_relative_step > 1e-3).all()
    sustained = _dying_flip(q=1.0)
    assert classify_dynamics(sustained[:, None, :]).kind.iloc[0] == "orbit"  # same, not decaying


def test_settled_means_the_last_steps_are_below_fixed_tol() -> None:
    rng = np.random.default_rng(6)
    c, d = rng.standard_normal(H), rng.standard_normal(H)
    fast = c + np.outer(0.5 ** np.arange(65), d)  # converged long before the end
    slow = c + np.outer(0.95 ** np.arange(65), d)  # still moving ~0.1 % a step at step 64
    df = classify_dynamics(np.stack([fast, slow, _circle(7.0)], axis=1))
    assert list(df.kind) == ["fixed_point", "fixed_point", "orbit"]
    assert list(df.settled) == [True, False, False]
    assert (df.max_tail_relative_step[df.settled] < 1e-3).all()
    loose = classify_dynamics(slow[:, None, :], fixed_tol=0.1)
    assert loose.settled.iloc[0]  # the threshold is the one rule 1 uses


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no default checkpoint")
def test_default_prompt_at_32_steps_shows_no_moving_token_as_settled() -> None:
    """The app's default: 32 steps on its default prompt. No token shown as a settled fixed point
    moves more than 1 % a step, and no token whose steps are still dying away is an orbit."""
    import recurrent_model as rm
    from apps.inputs import DEFAULT_PROMPT
    from workbench import collect

    model = rm.load_model(DEFAULT_CHECKPOINT)
    traj = collect(model, model.tokenizer.encode(DEFAULT_PROMPT), 32, seeds=(0,))
    states = traj.states[0].astype(np.float64)
    df = classify_dynamics(states, tokens=traj.tokens)
    rel = np.linalg.norm(np.diff(states, axis=0), axis=-1) / np.linalg.norm(states[1:], axis=-1)
    settled = df.settled.to_numpy()
    assert settled.any() and (rel[-4:, settled] < 0.01).all()
    assert (rel[-4:, settled] < 1e-3).all()
    still_moving = rel[-1] > 0.01
    assert not settled[still_moving].any()
    dying = (df.step_decay <= 0.7) & (df.contraction <= 0.97)
    assert not (dying & (df.kind == "orbit")).any(), df[dying][["token", "kind", "step_decay"]]


def test_a_tokens_row_is_the_same_bits_beside_any_tokens():
    """Tokens classified side by side (the corpus engine's batches) get the rows each group gets
    alone, in any order; without diagnostics, settled tokens lose only their diagnostics."""
    states = make_benchmark(seed=1, repeats=1, sizes=((64, 64),))[0].states
    T = states.shape[1]
    alone = pd.concat([classify_dynamics(states[:, i : i + 5]) for i in range(0, T, 5)])
    order = np.random.default_rng(0).permutation(T)
    together = classify_dynamics(states[:, order]).iloc[np.argsort(order)]
    pd.testing.assert_frame_equal(
        alone.drop(columns="token").reset_index(drop=True),
        together.drop(columns="token").reset_index(drop=True),
        check_exact=True,
    )
    full, lean = classify_dynamics(states), classify_dynamics(states, diagnostics=False)
    settled = (full["tail_relative_step"] < 1e-3).to_numpy()
    assert settled.any() and not settled.all()
    pd.testing.assert_frame_equal(lean[~settled], full[~settled], check_exact=True)
    kept = ["kind", "period", "flip", "settled", "final_step_size", "drift_speed", "window"]
    pd.testing.assert_frame_equal(lean[kept], full[kept], check_exact=True)
    assert lean.loc[settled, ["plane_variance_share", "contraction"]].isna().all().all()
