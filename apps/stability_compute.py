"""Cached stability computations behind the Stability tab.

Every analysis is a workbench call (``workbench.fixed_point_spectrum``, ``lyapunov``,
``stretch_attribution``); this module only estimates, caches and
reports progress.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch.func import jvp

import workbench
from recurrent_model.speed import synchronize
from recurrent_model.threads import threads_for
from workbench.core_map import problems
from workbench.lyapunov import lyapunov_run, spectrum_frame
from workbench.spectrum import arnoldi_jvps
from workbench.stretch_attribution import stretch_attribution

from . import compute, cost
from .cached import cached_analysis
from .inputs import RunSettings
from .progress import TaskProgress

#: Core passes a fixed-point search may spend.
FIXED_POINT_PASSES = 200
#: Seconds between two moves of the stability bar (each one a point where Stop acts).
BAR_INTERVAL = 0.25


def arnoldi_jvp_budget(k: int, h: int) -> int:
    """The most JVPs Arnoldi spends (``spectrum.arnoldi_jvps``): a clustered spectrum, such as a
    random model's, takes all of them, so the estimate (an upper bound) counts them all."""
    return arnoldi_jvps(k, h)[1]


#: The longest prefix :func:`jvp_passes` measures over (a longer one costs seconds at 3.5B).
JVP_PROBE_TOKENS = 8
_JVP_PASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def jvp_passes(model, tokens: int = 1) -> float:
    """What one JVP of a token's block map costs in plain calls of it, measured once per model
    and prefix length (up to JVP_PROBE_TOKENS): forward-mode AD's overhead depends on the dtype,
    the width, the device and the rows per call (from about 3 to 8 on a CPU), so no constant
    holds for every model."""
    n = max(1, min(tokens, JVP_PROBE_TOKENS, model.config.block_size))
    measured = _JVP_PASSES.setdefault(model, {})
    if n not in measured:
        measured[n] = _measured_jvp_passes(model, n)
    return measured[n]


def _measured_jvp_passes(model, tokens: int) -> float:
    """One plain call and one JVP of the last token's block map over a ``tokens`` prefix (the
    model's dtype), each after one untimed call that pays its first-use costs."""
    rows, _ = problems(model, [0] * tokens, None, 1, 0.0)
    block = rows[0].map.block(tokens - 1, rows[0].context)
    x = rows[0].context[tokens - 1]
    tangent = torch.ones_like(x)

    def seconds(call: Callable[[], object]) -> float:
        call()
        synchronize(x.device)
        start = time.perf_counter()
        call()
        synchronize(x.device)
        return time.perf_counter() - start

    with threads_for(model):
        with torch.no_grad():
            plain = seconds(lambda: block(x))
        forward = seconds(lambda: jvp(block, (x,), (tangent,)))
    return max(1.0, forward / max(plain, 1e-9))


def stability_passes(num_steps: int, k: int, h: int, jvp_cost: float) -> int:
    """Core-pass equivalents of one token's analysis (the fixed point and Arnoldi at their
    budgets), a JVP counted as ``jvp_cost`` passes."""
    lyapunov = num_steps * (1 + jvp_cost * k)
    attribution = num_steps * (1 + jvp_cost) + 2 * jvp_cost
    arnoldi = arnoldi_jvp_budget(k, h) * jvp_cost
    return int(np.ceil(lyapunov + attribution + arnoldi + FIXED_POINT_PASSES))


def estimate(model, tokens: int, num_steps: int, k: int) -> cost.CostEstimate:
    """The estimated cost of :func:`token_stability` on this device: its core-pass equivalents
    (a JVP at :func:`jvp_passes`) as one forward of that depth over the token's prefix."""
    passes = stability_passes(num_steps, k, model.config.n_embd, jvp_passes(model, tokens))
    flops = cost.forward_flops(model.config, tokens, passes)
    calls = cost.forward_calls(model.config, passes)
    return compute.estimate_flops(model, flops, rows=tokens, calls=calls, action="stability")


@dataclass(frozen=True)
class TokenStability:
    """Everything the Stability tab shows for one token."""

    spectrum: pd.DataFrame
    exponents: pd.DataFrame
    running: np.ndarray
    warmup: int
    attribution: pd.DataFrame | None  # None: the family's loop has no sub-layer split (not Huginn)
    distances: np.ndarray
    converged: bool
    residual: float


class StabilityBar:
    """The stability action's phases on its TaskProgress: every pass of each phase (the
    fixed-point search, Arnoldi's JVPs, the Lyapunov steps and the attribution's Benettin run)
    moves the bar, a few times a second at most, so Stop ends the action at the next pass."""

    # Each phase's share of the bar: (start, end).
    PHASES = {
        "fixed point": (0.0, 0.15),
        "eigenvalues": (0.15, 0.2),
        "Lyapunov exponents": (0.2, 0.8),
        "attribution": (0.8, 1.0),
    }

    def __init__(self, progress: TaskProgress, k: int, h: int) -> None:
        self.progress = progress
        self.expected = {
            "fixed point": FIXED_POINT_PASSES,
            "eigenvalues": arnoldi_jvp_budget(k, h),
        }

    def __call__(self, phase: str, done: int, total: int | None = None) -> None:
        total = total or self.expected[phase]
        if phase != self.progress.phase:
            self.progress.set_phase(phase, self.PHASES[phase], total)
        self.progress(min(done, total), total)

    def steps(self, phase: str) -> Callable[[int, int], None]:
        """An ``on_step(done, total)`` for ``phase``."""
        return lambda done, total: self(phase, done, total)


def stability_progress(position: int, guess: cost.CostEstimate) -> TaskProgress:
    """The bar of one token's stability: passes of each phase (at most, for the fixed point and
    Arnoldi, which may converge sooner), with the estimate beside it."""
    return TaskProgress(f"Stability of token {position}", "passes", guess, BAR_INTERVAL)


@cached_analysis(keyed=("traj",), max_entries=8)
def token_stability(
    _model, traj, run: RunSettings, position: int, k: int, _progress: TaskProgress
) -> TokenStability:
    """Spectrum at the token's fixed point (others at s_r), Lyapunov run and attribution along the
    collected trajectory of the first seed (collected with ``run``), and the distance of s_i from
    the fixed point. ``_model`` is the one ``traj``'s key names; ``_progress`` follows every
    phase (see StabilityBar), and a finished run calibrates the next estimate."""
    _progress.start()
    raw = torch.from_numpy(np.ascontiguousarray(traj.raw_states[0])).to(_model.dtype)
    ids = list(run.token_ids)
    steps = raw.shape[0] - 1
    moved = StabilityBar(_progress, k, _model.config.n_embd)
    with threads_for(_model), _progress.ticking():  # stop points between the passes too
        spectrum = workbench.fixed_point_spectrum(
            _model, ids, position=position, k=k, num_steps=steps, init_scale=run.init_scale,
            seed=run.seeds[0], max_iter=FIXED_POINT_PASSES, on_pass=moved,
        )  # fmt: skip
        lyap = lyapunov_run(
            _model, ids, steps, position=position, k=k, state=raw[0],
            on_step=moved.steps("Lyapunov exponents"),
        )  # fmt: skip
        attribution = None  # Huginn's sub-layers only (stretch_attribution says why)
        if getattr(_model, "family", "Huginn") == "Huginn":
            attribution = stretch_attribution(
                _model, ids, position=position, num_steps=steps, state=raw[0],
                on_step=moved.steps("attribution"),
            )  # fmt: skip
    point = torch.from_numpy(spectrum.attrs["state"]).to(raw.dtype)
    distances = ((raw[:, position] - point).norm(dim=-1) / point.norm()).double().numpy()
    exponents = spectrum_frame(lyap)
    _progress.finish()
    return TokenStability(
        spectrum, exponents, lyap.running, lyap.warmup, attribution, distances,
        bool(spectrum.attrs.get("converged", True)), float(spectrum.attrs["residual"]),
    )  # fmt: skip
