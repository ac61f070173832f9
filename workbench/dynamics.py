"""Dynamics classification per token: fixed point, orbit, slider or other (the paper's section 7).

Each token's tail (its last `tail` steps, default half the run) is measured by
`workbench.dynamics_features` and the numbers are turned into a kind, first match wins (below).
With the default tail, a token that is not an orbit on it is tested again on the longer window
that starts where its transient ends (`dynamics_features.transient_end`: the first state after
which steps and distances from the tail's mean stay within 1.5 × those of the tail): an orbit
whose period is 55–75 % of the run holds < 0.8 turns in half the run but more after its transient.
When only the longer window shows an orbit, the token is an orbit measured on that window; the
`window` and `window_start` columns say which steps were analysed. An explicit `tail` is kept.

1. fixed_point: the median relative step ‖x_t − x_{t−1}‖/‖x_t‖ of the last 4 steps < `fixed_tol`;
2. orbit: the best single-frequency fit c + a cos ωt + b sin ωt of the tail's top PCs (ω from a
   spectral grid, refined, backfitted against a second rotation) explains ≥ `min_plane_share` of the
   tail variance, makes ≥ `min_revolutions` turns over the tail, is a true ellipse (minor/major ≥
   `min_aspect`), the angle in the ellipse's own coordinates advances monotonically (share of
   steps advancing forward by less than 3ω ≥ `min_angle_consistency`; closed non-elliptic loops
   such as rounded squares or limaçons pass) at a mean speed that agrees with the spectral ω within
   `max_speed_mismatch`, and its radius does not shrink (per-step trend > `max_contraction`: a
   converging spiral is a fixed point), nor do its step norms (a damped spiral or flip: log-linear
   decay, or a noisy trend whose last third's mean step is ≤ `max_step_decay` of the first's).
   A transient that is still dying away is never an orbit, however cleanly it alternates: it is
   a fixed point that has not settled.
   Near period 2 (ω > 0.9π) the ellipse degenerates to a flip: two alternating states. Only share,
   turns and no decay are required, and the boolean column `flip` marks these orbits (kind stays
   "orbit": a 2-cycle is a periodic orbit of the iteration, and readers of `kind` keep working;
   the second vector of its `rotation_plane` carries no rotation);
3. fixed_point (converging): step norms in the top-3 PC space fall geometrically (ratio ≤
   `max_contraction` per step, log-linear R² ≥ `min_decay_fit`, or the noisy trend of rule 2),
   or the displacements between the
   means of the tail's quarters shrink monotonically at that rate, by ≤ `max_chunk_shrink` overall,
   while they exceed jitter (4). Step norms, chunk means and the settling ratio are measured on
   the top-3 PC scores, where i.i.d. noise in R^h is mostly projected out;
4. fixed_point (noisy): jitter around a point: the means of the last two quarters are closer than
   `max_settling_ratio` mean steps and the spread is ≤ `max_jitter` of the norm;
5. slider: net displacement / path length over 8 chunks ≥ `min_straightness`, or the same in the
   top-3 PC space ≥ `min_pc_straightness`;
6. other (e.g. a random walk, or an orbit with too few turns in the tail).

`settled` says whether a fixed point has got there: the largest relative step of the last 4 is
below `fixed_tol` (rule 1 takes their median). A fixed point with `settled` False is still
converging (rules 1, 3 and 4 with larger steps); show it as "converging", not as a fixed point.

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
from functools import cache

import numpy as np
import pandas as pd
from threadpoolctl import ThreadpoolController

from ._frames import token_labels
from .dynamics_features import (
    convergence_features,
    drift_features,
    relative_steps,
    tail_pca,
    transient_end,
)
from .dynamics_rotation import plane_bases, rotation_fit

KINDS = ("fixed_point", "orbit", "slider", "other")
FLIP_SPEED = 0.9 * np.pi  # orbits faster than this (period < 2.2 steps) are period-2 flips
MIN_TAIL = 8


@dataclass(frozen=True)
class DynamicsThresholds:
    """Decision thresholds of `classify_dynamics` (defaults chosen on `workbench.synthetic`)."""

    fixed_tol: float = 1e-3  # converged: median relative step of the last 4 steps below this
    max_contraction: float = 0.97  # converging: step norms shrink by at least this ratio per step
    min_decay_fit: float = 0.8  # R² of the log-linear step-norm decay
    max_chunk_shrink: float = 0.5  # converging: last / first displacement of the quarter means
    max_step_decay: float = 0.7  # decaying: last / first third's mean step norm of the tail
    min_trend_fit: float = 0.3  # decaying with wobble: R² of the log-linear decay at least this
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


#: The label every view shows per token: a fixed point that has not settled is "converging".
LABELS = ("fixed_point", "converging", "orbit", "slider", "other")


def dynamics_labels(verdicts: pd.DataFrame) -> pd.Series:
    """One label per token (``LABELS``) from ``classify_dynamics``' ``kind`` and ``settled`` (or,
    from a frame without it, its last relative step below the fixed-point tolerance)."""
    if "settled" in verdicts.columns:
        settled = verdicts["settled"].astype(bool)
    else:
        settled = verdicts["final_step_size"] < DynamicsThresholds().fixed_tol
    labels = verdicts["kind"].astype(object).copy()
    labels[(labels == "fixed_point") & ~settled] = "converging"
    return labels


def label_shares(verdicts: pd.DataFrame | Sequence[pd.DataFrame]) -> dict[str, float]:
    """The share of each label of ``LABELS`` over the tokens of one or several verdict frames."""
    frames = [verdicts] if isinstance(verdicts, pd.DataFrame) else list(verdicts)
    labels = pd.concat([dynamics_labels(f) for f in frames], ignore_index=True)
    counts = labels.value_counts(normalize=True)
    return {label: float(counts.get(label, 0.0)) for label in LABELS}


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


def _is_decaying(f: pd.DataFrame, th: DynamicsThresholds) -> pd.Series:
    """Step norms shrinking: geometrically with a clean log-linear fit, or (a noisy or wobbling
    decay, e.g. a damped flip whose amplitude wobbles) by a trend (R² ≥ `min_trend_fit`) that
    leaves the tail's last third with at most `max_step_decay` of the first third's mean step."""
    shrinking = f.contraction <= th.max_contraction
    clean_fit = f.contraction_fit >= th.min_decay_fit
    trend = (f.contraction_fit >= th.min_trend_fit) & (f.step_decay <= th.max_step_decay)
    return shrinking & (clean_fit | trend)


def _is_converging(f: pd.DataFrame, th: DynamicsThresholds) -> np.ndarray:
    moving = f.settling_ratio > th.max_settling_ratio  # chunk means move beyond jitter
    shrinking = f.chunk_shrink <= th.max_chunk_shrink
    chunks = moving & shrinking & (f.chunk_contraction <= th.max_contraction)
    return (chunks | _is_decaying(f, th)).to_numpy()


def _is_orbit(f: pd.DataFrame, th: DynamicsThresholds) -> np.ndarray:
    omega = f.angular_speed.fillna(0.0)
    # step norms shrinking: a converging spiral or damped flip (a transient), never an orbit
    decaying = _is_decaying(f, th)
    flip_flop = omega > FLIP_SPEED  # period close to 2: the ellipse degenerates to a segment
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
        & ~decaying
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


@cache
def _threadpools() -> ThreadpoolController:
    """The BLAS and OpenMP pools of this process, found once (a lookup reads the loaded libraries)."""
    return ThreadpoolController()


def one_blas_thread():
    """A context with one BLAS thread: the features are many small matrices, and threads
    oversubscribe shared CPUs (and the forward running beside a background classification)."""
    return _threadpools().limit(limits=1)


def _tails(states: np.ndarray, window: int, idx: np.ndarray) -> np.ndarray:
    """The last `window` steps of the tokens `idx` as float64 (len(idx), window + 1, h), C-ordered
    so every token's tail has one memory layout whatever tokens are beside it."""
    return np.ascontiguousarray(np.swapaxes(states[-window - 1 :, idx], 0, 1), dtype=np.float64)


def _window_features(
    tails: np.ndarray, th: DynamicsThresholds, planes: bool
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Every diagnostic of tails (T, W + 1, h) and, if `planes`, their rotation planes (T, 2, h)."""
    pca = tail_pca(tails, th.n_components)
    rot = rotation_fit(pca.scores, pca.total)
    window = tails.shape[1] - 1
    values = (
        convergence_features(tails, pca)
        | drift_features(pca)
        | dict(
            angular_speed=rot.omega,
            revolutions=rot.omega * window / (2 * np.pi),
            plane_variance_share=rot.share,
            aspect=rot.aspect,
            angle_speed=rot.angle_speed,
            angle_consistency=rot.consistency,
            radial_trend=rot.radial_trend,
        )
    )
    return values, plane_bases(rot, pca.components(tails)) if planes else None


def _features(
    states: np.ndarray,
    windows: np.ndarray,
    th: DynamicsThresholds,
    planes: bool = False,
    diagnostics: bool = True,
    chunk_bytes: int = 64 << 20,
) -> tuple[pd.DataFrame, np.ndarray | None]:
    """Diagnostic numbers of every token's window (its last `windows[i]` steps; one row each) and,
    if `planes`, the rotation planes (T, 2, h).

    Without `diagnostics`, a token settled by rule 1 gets only its relative steps (the rest NaN):
    rule 1 decides it, and at many steps most tokens are settled. Tokens are grouped by window
    length; windows are converted to float64 and processed in batches of tokens of at most
    `chunk_bytes`, so memory stays bounded at any width. Every operation acts on one token's
    numbers alone, so a token's row is the same bits in any batch.
    """
    T, h = states.shape[1], states.shape[2]
    empty = _window_features(np.zeros((0, MIN_TAIL + 1, h)), th, False)[0]
    columns = {name: np.full(T, np.nan) for name in empty} | {"window": np.zeros(T, dtype=int)}
    bases = np.zeros((T, 2, h)) if planes else None
    with one_blas_thread():
        for window in np.unique(windows):
            tokens = np.flatnonzero(windows == window)
            chunk = max(1, min(256, chunk_bytes // (8 * (window + 1) * h)))
            for start in range(0, len(tokens), chunk):
                idx = tokens[start : start + chunk]
                tails = _tails(states, window, idx)
                steps = relative_steps(tails)
                full = diagnostics | (steps["tail_relative_step"] >= th.fixed_tol)
                values, plane = _window_features(tails[full], th, planes)
                for name, value in values.items():
                    columns[name][idx[full]] = value
                for name, value in steps.items():
                    columns[name][idx[~full]] = value[~full]
                columns["window"][idx] = window
                if planes:
                    bases[idx[full]] = plane
    return pd.DataFrame(columns), bases


def transient_windows(states: np.ndarray, tail: int, chunk_bytes: int = 64 << 20) -> np.ndarray:
    """Per token (T,), the steps after the end of its transient (`dynamics_features.transient_end`),
    at least `tail`, rounded down to tail + a multiple of steps // 16 (a slightly later start)."""
    steps, T, h = states.shape[0] - 1, states.shape[1], states.shape[2]
    out = np.full(T, tail, dtype=int)
    if tail >= steps:
        return out
    chunk = max(1, min(256, chunk_bytes // (8 * (steps + 1) * h)))
    with one_blas_thread():
        for start in range(0, T, chunk):
            runs = _tails(states, steps, np.arange(start, min(start + chunk, T)))
            out[start : start + chunk] = steps - transient_end(runs, tail)
    quantum = max(2, steps // 16)  # a few window lengths, so tokens stay batched
    return tail + (out - tail) // quantum * quantum


def _analyse(
    states: np.ndarray,
    tail: int,
    adaptive: bool,
    th: DynamicsThresholds,
    planes: bool = False,
    diagnostics: bool = True,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray | None]:
    """Features, kinds and (if `planes`) rotation planes of every token.

    Every token is judged on the fixed window of the last `tail` steps. With `adaptive`, a token
    whose transient ends earlier is also tested for an orbit on the longer window after its
    transient; when only that window shows an orbit (a period too long for the fixed window), the
    token is an orbit and its numbers come from the longer window.
    """
    T = states.shape[1]
    feats, bases = _features(states, np.full(T, tail), th, planes, diagnostics)
    kinds = _decide(feats, th)
    if not adaptive or T == 0:
        return feats, kinds, bases
    moving = (kinds != "orbit") & (feats.tail_relative_step.to_numpy() >= th.fixed_tol)
    candidates = np.flatnonzero(moving)
    windows = transient_windows(states[:, candidates], tail)
    candidates, windows = candidates[windows > tail], windows[windows > tail]
    if len(candidates):
        sub = states[:, candidates]
        long_feats, long_bases = _features(sub, windows, th, planes)
        found = _is_orbit(long_feats, th)
        chosen = candidates[found]
        if len(chosen):
            for col in feats.columns:
                feats.loc[chosen, col] = long_feats[col].to_numpy()[found]
            kinds[chosen] = "orbit"
            if planes:
                bases[chosen] = long_bases[found]
    return feats, kinds, bases


def _table(
    f: pd.DataFrame,
    kinds: np.ndarray,
    tokens: Sequence[str] | None,
    steps: int,
    fixed_tol: float,
) -> pd.DataFrame:
    """The output frame: kind columns (blank where they do not apply), then the diagnostics."""
    orbit, slider = kinds == "orbit", kinds == "slider"
    omega = f.angular_speed.to_numpy()
    window = f.window.to_numpy().astype(int)
    out = pd.DataFrame(
        dict(
            token=token_labels(tokens, len(f)),
            kind=kinds,
            period=np.where(orbit, 2 * np.pi / np.where(orbit, omega, 1.0), np.nan),
            angular_speed=np.where(orbit, omega, np.nan),
            flip=orbit & (np.nan_to_num(omega) > FLIP_SPEED),
            settled=(kinds == "fixed_point") & (f.max_tail_relative_step.to_numpy() < fixed_tol),
            drift_speed=np.where(slider, f.drift_velocity_norm, np.nan),
            drift_direction_share=np.where(slider, f.drift_variance_share, np.nan),
        ),
        index=pd.RangeIndex(len(f), name="position"),
    )
    rest = f.drop(columns=["angular_speed", "window"]).set_index(out.index)
    return pd.concat([out, rest.assign(window=window, window_start=steps - window)], axis=1)


def classify_dynamics(
    states: np.ndarray,
    tail: int | None = None,
    tokens: Sequence[str] | None = None,
    *,
    diagnostics: bool = True,
    **thresholds: float,
) -> pd.DataFrame:
    """Classify each token's dynamics from the last `tail` steps of states (steps + 1, T, h).

    Returns one row per token (index = token position) with `token` (the string from `tokens`, or
    the position as a string), `kind` (one of KINDS), `period` and `angular_speed` (rad/step; NaN
    unless orbit), `flip` (True for period-2 orbits: two alternating states), `drift_speed` (distance per step) and `drift_direction_share` (NaN unless
    slider), `final_step_size` ‖s_r − s_{r−1}‖/‖s_r‖, `settled` (a fixed point whose last 4
    relative steps are all below `fixed_tol`; False for a converging one and for every other
    kind), and the diagnostics behind the decision
    (see `DynamicsThresholds` and the module docstring).
    `window`/`window_start` (the steps analysed: the tail, or for an orbit found only after its
    transient, the steps from the transient's end).
    `tail` defaults to min(steps, max(16, steps // 2)), with the transient-end window tried for
    orbits (module docstring); an explicit `tail` is used as given. Keyword thresholds override the
    `DynamicsThresholds` defaults. Raises ValueError on NaN/inf or fewer than 8 tail steps.

    A token's row depends on its own states only: several prompts' states side by side (the
    token axis) give each prompt's rows, bit for bit. With `diagnostics=False` a token that rule 1
    settles skips the PCA and rotation fit and gets NaN diagnostics (the kind columns, the relative
    steps and `window` stay the same bits): the corpus engine's path, where most tokens settle.
    """
    th = DynamicsThresholds(**thresholds)
    adaptive = tail is None
    states, tail = _check_states(states, tail)
    feats, kinds, _ = _analyse(states, tail, adaptive, th, diagnostics=diagnostics)
    return _table(feats, kinds.astype(object), tokens, states.shape[0] - 1, th.fixed_tol)


def rotation_plane(traj: np.ndarray, tail: int | None = None, n_components: int = 8) -> np.ndarray:
    """Orthonormal basis (2, h) of the dominant rotation plane of one token's trajectory
    (steps + 1, h).

    Meaningful when the token is classified as an orbit; for other kinds it is the plane of the best
    single-frequency fit.
    """
    return rotation_planes(np.asarray(traj)[:, None, :], tail, n_components)[0]


def rotation_planes(
    states: np.ndarray, tail: int | None = None, n_components: int = 8
) -> np.ndarray:
    """Rotation plane bases (T, 2, h) of every token of states (steps + 1, T, h); see
    `rotation_plane`."""
    adaptive = tail is None
    states, tail = _check_states(states, tail)
    th = DynamicsThresholds(n_components=n_components)
    return _analyse(states, tail, adaptive, th, planes=True)[2]
