"""Dynamics classification per token: fixed point, orbit, slider or other (analysis.md item 3).

Each token's tail (its last `tail` steps) is measured by `workbench.dynamics_features` and the
numbers are turned into a kind, first match wins:

1. fixed_point: the median relative step ‖x_t − x_{t−1}‖/‖x_t‖ of the last 4 steps < `fixed_tol`;
2. orbit: the best single-frequency fit c + a cos ωt + b sin ωt of the tail's top PCs (ω from a
   spectral grid, refined, backfitted against a second rotation) explains ≥ `min_plane_share` of the
   tail variance, makes ≥ `min_revolutions` turns over the tail, is a true ellipse (minor/major ≥
   `min_aspect`), the angle in the ellipse's own coordinates advances monotonically (share of
   steps advancing forward by less than 3ω ≥ `min_angle_consistency`; closed non-elliptic loops
   such as rounded squares or limaçons pass) at a mean speed that agrees with the spectral ω within
   `max_speed_mismatch`, and its radius does not shrink (per-step trend > `max_contraction`: a
   converging spiral is a fixed point). Near period 2 (ω > 0.9π) the ellipse degenerates to a
   flip-flop and only share and turns are required;
3. fixed_point (converging): step norms in the top-3 PC space fall geometrically (ratio ≤
   `max_contraction` per step, log-linear R² ≥ `min_decay_fit`), or the displacements between the
   means of the tail's quarters shrink monotonically at that rate, by ≤ `max_chunk_shrink` overall,
   while they exceed jitter (4). Step norms, chunk means and the settling ratio are measured on
   the top-3 PC scores, where i.i.d. noise in R^h is mostly projected out;
4. fixed_point (noisy): jitter around a point: the means of the last two quarters are closer than
   `max_settling_ratio` mean steps and the spread is ≤ `max_jitter` of the norm;
5. slider: net displacement / path length over 8 chunks ≥ `min_straightness`, or the same in the
   top-3 PC space ≥ `min_pc_straightness`;
6. other (e.g. a random walk, or an orbit with too few turns in the tail).

Angular speed is reported in (0, π]: a sampled rotation by ω and one by 2π − ω in the opposite sense
are the same sequence, so periods are ≥ 2 steps. The period is steps per revolution of the dominant
rotation (2π/ω); a loop that winds around its centre twice before closing (e.g. a trefoil whose
second harmonic dominates) reports the winding, half its closure period. The tail should hold at
least one period; with fewer turns an orbit is "other". Chaotic flows with a dominant rotation can
look like an orbit over one or two turns: the diagnostic columns (`plane_variance_share`,
`angle_consistency`, `revolutions`) say how clean a reported orbit is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from ._frames import token_labels
from .dynamics_features import convergence_features, drift_features, tail_pca
from .dynamics_rotation import plane_bases, rotation_fit

KINDS = ("fixed_point", "orbit", "slider", "other")
MIN_TAIL = 8


@dataclass(frozen=True)
class DynamicsThresholds:
    """Decision thresholds of `classify_dynamics` (defaults chosen on `workbench.synthetic`)."""

    fixed_tol: float = 1e-3  # converged: median relative step of the last 4 steps below this
    max_contraction: float = 0.97  # converging: step norms shrink by at least this ratio per step
    min_decay_fit: float = 0.8  # R² of the log-linear step-norm decay
    max_chunk_shrink: float = 0.5  # converging: last / first displacement of the quarter means
    min_plane_share: float = 0.5  # orbit: share of tail variance in the fitted rotation
    min_revolutions: float = 0.8  # orbit: turns over the tail
    min_aspect: float = 0.1  # orbit: minor/major axis of the ellipse
    min_angle_consistency: float = 0.8  # orbit: share of steps advancing by 0 … 3ω
    max_speed_mismatch: float = 0.15  # orbit: |mean angle step − spectral ω| / ω
    min_straightness: float = 0.6  # slider: net displacement / coarse path length
    min_pc_straightness: float = 0.8  # slider: the same in the top-3 PC space (noise removed)
    max_settling_ratio: float = 1.0  # noisy fixed point: chunk-mean move / mean step
    max_jitter: float = 0.05  # noisy fixed point: RMS spread / norm
    n_components: int = 8  # PCs of the tail used by the rotation fit


def default_tail(steps: int) -> int:
    """Default tail length: min(steps, max(16, steps // 2))."""
    return min(steps, max(16, steps // 2))


def _check_states(states: np.ndarray, tail: int | None) -> tuple[np.ndarray, int]:
    """Validate shape, finiteness and tail; the states are returned as given (no copy)."""
    states = np.asarray(states)
    if states.ndim != 3:
        raise ValueError(f"states must be (steps + 1, T, h), got shape {states.shape}")
    for start in range(0, states.shape[1], 64):  # bounded temporary memory for huge inputs
        if not np.all(np.isfinite(states[:, start : start + 64])):
            raise ValueError("states contain NaN or inf values")
    steps = states.shape[0] - 1
    tail = default_tail(steps) if tail is None else int(tail)
    if tail > steps:
        raise ValueError(f"tail={tail} is longer than the {steps} steps available")
    if tail < MIN_TAIL:
        raise ValueError(f"need a tail of at least {MIN_TAIL} steps, got {tail} (steps={steps})")
    return states, tail


def _is_converging(f: pd.DataFrame, th: DynamicsThresholds) -> np.ndarray:
    moving = f.settling_ratio > th.max_settling_ratio  # chunk means move beyond jitter
    shrinking = f.chunk_shrink <= th.max_chunk_shrink
    chunks = moving & shrinking & (f.chunk_contraction <= th.max_contraction)
    steps = (f.contraction <= th.max_contraction) & (f.contraction_fit >= th.min_decay_fit)
    return (chunks | steps).to_numpy()


def _is_orbit(f: pd.DataFrame, th: DynamicsThresholds) -> np.ndarray:
    omega = f.angular_speed.fillna(0.0)
    flip_flop = omega > 0.9 * np.pi  # period close to 2: the ellipse degenerates to a segment
    ellipse = (
        (f.aspect >= th.min_aspect)
        & (f.angle_consistency >= th.min_angle_consistency)
        & ((f.angle_speed - omega).abs() <= th.max_speed_mismatch * omega)
    )
    return (
        (omega > 0)
        & (f.plane_variance_share >= th.min_plane_share)
        & (f.revolutions >= th.min_revolutions)
        & (flip_flop | ellipse)
        & (f.radial_trend > th.max_contraction)  # not a converging spiral
    ).to_numpy()


def _decide(f: pd.DataFrame, th: DynamicsThresholds) -> np.ndarray:
    """The kind of every token from its features (first rule that holds, see module docstring)."""
    rules = [
        ("fixed_point", (f.tail_relative_step < th.fixed_tol).to_numpy()),
        ("orbit", _is_orbit(f, th)),
        ("fixed_point", _is_converging(f, th)),
        (
            "fixed_point",
            ((f.settling_ratio <= th.max_settling_ratio) & (f.spread <= th.max_jitter)),
        ),
        (
            "slider",
            (f.straightness >= th.min_straightness) | (f.pc_straightness >= th.min_pc_straightness),
        ),
    ]
    return np.select([np.asarray(m) for _, m in rules], [k for k, _ in rules], default="other")


def _features(
    states: np.ndarray,
    tail: int,
    th: DynamicsThresholds,
    planes: bool = False,
    chunk_bytes: int = 64 << 20,
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """Diagnostic numbers of every token's tail (one row each) and, if `planes`, the rotation
    planes (T, 2, h).

    Tails are converted to float64 and processed in batches of tokens of at most `chunk_bytes`, so
    memory stays bounded at any width.
    """
    frames, bases = [], []
    chunk = max(1, min(256, chunk_bytes // (8 * (tail + 1) * states.shape[2])))
    # one BLAS thread: these are many small matrices, and threads oversubscribe shared CPUs
    with threadpool_limits(1):
        for start in range(0, max(states.shape[1], 1), chunk):
            tails = np.swapaxes(states[-tail - 1 :, start : start + chunk], 0, 1).astype(np.float64)
            pca = tail_pca(tails, th.n_components)
            rot = rotation_fit(pca.scores, pca.total)
            if planes:
                bases.append(plane_bases(rot, pca.components(tails)))
            frames.append(
                pd.DataFrame(
                    convergence_features(tails, pca)
                    | drift_features(pca)
                    | dict(
                        angular_speed=rot.omega,
                        revolutions=rot.omega * tail / (2 * np.pi),
                        plane_variance_share=rot.share,
                        aspect=rot.aspect,
                        angle_speed=rot.angle_speed,
                        angle_consistency=rot.consistency,
                        radial_trend=rot.radial_trend,
                    )
                )
            )
    return pd.concat(frames, ignore_index=True), np.concatenate(bases) if planes else None


def _table(f: pd.DataFrame, kinds: np.ndarray, tokens: Sequence[str] | None) -> pd.DataFrame:
    """The output frame: kind columns (blank where they do not apply), then the diagnostics."""
    orbit, slider = kinds == "orbit", kinds == "slider"
    omega = f.angular_speed.to_numpy()
    out = pd.DataFrame(
        dict(
            token=token_labels(tokens, len(f)),
            kind=kinds,
            period=np.where(orbit, 2 * np.pi / np.where(orbit, omega, 1.0), np.nan),
            angular_speed=np.where(orbit, omega, np.nan),
            drift_speed=np.where(slider, f.drift_velocity_norm, np.nan),
            drift_direction_share=np.where(slider, f.drift_variance_share, np.nan),
        ),
        index=pd.RangeIndex(len(f), name="position"),
    )
    return pd.concat([out, f.drop(columns="angular_speed").set_index(out.index)], axis=1)


def classify_dynamics(
    states: np.ndarray,
    tail: int | None = None,
    tokens: Sequence[str] | None = None,
    **thresholds: float,
) -> pd.DataFrame:
    """Classify each token's dynamics from the last `tail` steps of states (steps + 1, T, h).

    Returns one row per token (index = token position) with `token` (the string from `tokens`, or
    the position as a string), `kind` (one of KINDS), `period` and `angular_speed` (rad/step; NaN
    unless orbit), `drift_speed` (distance per step) and `drift_direction_share` (NaN unless
    slider), `final_step_size` ‖s_r − s_{r−1}‖/‖s_r‖, and the diagnostics behind the decision
    (see `DynamicsThresholds` and the module docstring).
    `tail` defaults to min(steps, max(16, steps // 2)); keyword thresholds override the
    `DynamicsThresholds` defaults. Raises ValueError on NaN/inf or fewer than 8 tail steps.
    """
    th = DynamicsThresholds(**thresholds)
    states, tail = _check_states(states, tail)
    feats, _ = _features(states, tail, th)
    return _table(feats, _decide(feats, th).astype(object), tokens)


def rotation_plane(traj: np.ndarray, tail: int | None = None, n_components: int = 8) -> np.ndarray:
    """Orthonormal basis (2, h) of the dominant rotation plane of one token's trajectory
    (steps + 1, h).

    Meaningful when the token is classified as an orbit; for other kinds it is the plane of the best
    single-frequency fit.
    """
    states, tail = _check_states(np.asarray(traj)[:, None, :], tail)
    th = DynamicsThresholds(n_components=n_components)
    return _features(states, tail, th, planes=True)[1][0]


def rotation_planes(
    states: np.ndarray, tail: int | None = None, n_components: int = 8
) -> np.ndarray:
    """Rotation plane bases (T, 2, h) of every token of states (steps + 1, T, h); see
    `rotation_plane`."""
    states, tail = _check_states(states, tail)
    return _features(states, tail, DynamicsThresholds(n_components=n_components), planes=True)[1]
