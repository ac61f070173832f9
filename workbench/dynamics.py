"""Dynamics classification per token: fixed point, orbit, slider or other (analysis.md item 3).

Each token's tail (its last `tail` steps) is measured by `workbench.dynamics_features` and the
numbers are turned into a kind, in this order:

1. fixed_point: the median relative step of the last 4 steps is below `fixed_tol`, or the motion
   shrinks geometrically: step norms in the top-3 PC space fall by a ratio ≤ `max_contraction` per
   step (log-linear fit R² ≥ `min_decay_fit`), or the displacements between the means of the tail's
   quarters shrink monotonically at that rate while they move more than jitter (see 3);
2. orbit: a single-frequency fit c + a cos ωt + b sin ωt of the tail's top PCs explains at least
   `min_plane_share` of the variance, makes ≥ `min_revolutions` turns over the tail, is a true
   ellipse (minor/major ≥ `min_aspect`, waived near period 2 where the rotation aliases to a
   flip-flop), and the angle in that plane advances steadily (share of steps within 50 % of ω ≥
   `min_angle_consistency`), at a median speed that agrees with the spectral ω within
   `max_speed_mismatch`;
3. fixed_point (noisy): the tail is jitter around a point: the means of its last two quarters are
   closer than `max_settling_ratio` mean steps, and its spread is ≤ `max_jitter` of the norm;
4. slider: net displacement / coarse path length ≥ `min_straightness`;
5. other.

Angular speed is reported in (0, π]: a sampled rotation of ω and one of 2π − ω in the opposite sense
are the same sequence, so periods are ≥ 2 steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from .dynamics_features import convergence_features, drift_features, rotation_fit, tail_pca

KINDS = ("fixed_point", "orbit", "slider", "other")
MIN_TAIL = 8


@dataclass(frozen=True)
class DynamicsThresholds:
    """Decision thresholds of `classify_dynamics` (defaults tuned on `workbench.synthetic`)."""

    fixed_tol: float = 1e-3
    max_contraction: float = 0.97
    min_decay_fit: float = 0.8
    min_plane_share: float = 0.5
    min_revolutions: float = 0.8
    min_aspect: float = 0.1
    min_angle_consistency: float = 0.8
    max_speed_mismatch: float = 0.15
    min_straightness: float = 0.6
    max_settling_ratio: float = 1.0
    max_jitter: float = 0.05
    n_components: int = 8


def default_tail(steps: int) -> int:
    """Default tail length: min(steps, max(16, steps // 2))."""
    return min(steps, max(16, steps // 2))


def _check_states(states: np.ndarray, tail: int | None) -> tuple[np.ndarray, int]:
    states = np.asarray(states)
    if states.ndim != 3:
        raise ValueError(f"states must be (steps + 1, T, h), got shape {states.shape}")
    if not np.all(np.isfinite(states)):
        raise ValueError("states contain NaN or inf values")
    steps = states.shape[0] - 1
    tail = default_tail(steps) if tail is None else int(tail)
    if tail > steps:
        raise ValueError(f"tail={tail} is longer than the {steps} steps available")
    if tail < MIN_TAIL:
        raise ValueError(f"need a tail of at least {MIN_TAIL} steps, got {tail} (steps={steps})")
    return states.astype(np.float64, copy=False), tail


def _is_converging(f: dict, th: DynamicsThresholds) -> bool:
    moving = f["settling_ratio"] > th.max_settling_ratio  # chunk means move beyond jitter
    if moving and f["chunk_contraction"] <= th.max_contraction:
        return True
    return f["contraction"] <= th.max_contraction and f["contraction_fit"] >= th.min_decay_fit


def _is_orbit(f: dict, th: DynamicsThresholds) -> bool:
    omega = f["angular_speed"]
    if not np.isfinite(omega) or omega <= 0:
        return False
    flip_flop = omega > 0.9 * np.pi  # period close to 2: the ellipse degenerates to a segment
    return (
        f["plane_variance_share"] >= th.min_plane_share
        and f["revolutions"] >= th.min_revolutions
        and (flip_flop or f["aspect"] >= th.min_aspect)
        and (flip_flop or f["angle_consistency"] >= th.min_angle_consistency)
        and (flip_flop or abs(f["angle_speed"] - omega) <= th.max_speed_mismatch * omega)
        and f["radial_trend"] > th.max_contraction  # not a converging spiral
    )


def _decide(f: dict, th: DynamicsThresholds) -> str:
    if f["tail_relative_step"] < th.fixed_tol:
        return "fixed_point"
    if _is_orbit(f, th):
        return "orbit"
    if _is_converging(f, th):
        return "fixed_point"
    if f["settling_ratio"] <= th.max_settling_ratio and f["spread"] <= th.max_jitter:
        return "fixed_point"
    if f["straightness"] >= th.min_straightness:
        return "slider"
    return "other"


def token_features(
    tail: np.ndarray, scores: np.ndarray, components: np.ndarray, total_var: float
) -> tuple[dict, np.ndarray]:
    """All diagnostic numbers of one token's tail (W + 1, h) given its PCA (see `tail_pca`), and
    its rotation plane (2, h)."""
    rot = rotation_fit(scores, components, total_var)
    f = convergence_features(tail, scores) | drift_features(tail)
    f |= dict(
        angular_speed=rot.omega,
        revolutions=rot.omega * (len(tail) - 1) / (2 * np.pi),
        plane_variance_share=rot.share,
        aspect=rot.aspect,
        angle_speed=rot.angle_speed,
        angle_consistency=rot.consistency,
        radial_trend=rot.radial_trend,
    )
    return f, rot.plane


def _features(
    states: np.ndarray, tail: int, th: DynamicsThresholds, chunk: int = 64
) -> tuple[list[dict], np.ndarray]:
    """Features and rotation planes (T, 2, h) of every token, PCA batched over `chunk` tokens."""
    feats, planes = [], []
    # one BLAS thread: these are many small matrices, and threads oversubscribe shared CPUs
    with threadpool_limits(1):
        for start in range(0, states.shape[1], chunk):
            tails = np.swapaxes(states[-tail - 1 :, start : start + chunk], 0, 1)
            scores, comps, total = tail_pca(tails, th.n_components)
            for i in range(len(tails)):
                f, plane = token_features(tails[i], scores[i], comps[i], float(total[i]))
                feats.append(f)
                planes.append(plane)
    return feats, np.stack(planes)


def _row(f: dict, kind: str) -> dict:
    """Blank the kind-specific columns that do not apply to `kind`."""
    orbit, slider = kind == "orbit", kind == "slider"
    omega = f["angular_speed"]
    return dict(
        kind=kind,
        period=2 * np.pi / omega if orbit else np.nan,
        angular_speed=omega if orbit else np.nan,
        drift_speed=f["drift_velocity_norm"] if slider else np.nan,
        drift_direction_share=f["drift_variance_share"] if slider else np.nan,
    ) | {k: v for k, v in f.items() if k != "angular_speed"}


def classify_dynamics(
    states: np.ndarray, tail: int | None = None, **thresholds: float
) -> pd.DataFrame:
    """Classify each token's dynamics from the last `tail` steps of states (steps + 1, T, h).

    Returns one row per token (index = token position) with `token`, `kind` (one of KINDS),
    `period` and `angular_speed` (rad/step; NaN unless orbit), `drift_speed` (distance per step)
    and `drift_direction_share` (NaN unless slider), `final_step_size` ‖s_r − s_{r−1}‖/‖s_r‖, and
    the diagnostics behind the decision (see `DynamicsThresholds` and the module docstring).
    `tail` defaults to min(steps, max(16, steps // 2)); keyword thresholds override the
    `DynamicsThresholds` defaults. Raises ValueError on NaN/inf or fewer than 8 tail steps.
    """
    th = DynamicsThresholds(**thresholds)
    states, tail = _check_states(states, tail)
    feats, _ = _features(states, tail, th)
    rows = [dict(token=i) | _row(f, _decide(f, th)) for i, f in enumerate(feats)]
    return pd.DataFrame(rows, index=pd.RangeIndex(len(rows), name="position"))


def rotation_plane(traj: np.ndarray, tail: int | None = None, n_components: int = 8) -> np.ndarray:
    """Orthonormal basis (2, h) of the dominant rotation plane of one token's trajectory (steps+1, h).

    Meaningful when the token is classified as an orbit; for other kinds it is the plane of the best
    single-frequency fit.
    """
    states, tail = _check_states(np.asarray(traj)[:, None, :], tail)
    _, planes = _features(states, tail, DynamicsThresholds(n_components=n_components))
    return planes[0]


def thresholds_dict() -> dict[str, float]:
    """The default thresholds as a plain dict (for display)."""
    return asdict(DynamicsThresholds())
