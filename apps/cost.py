"""What a heavy action will cost before it starts, and run defaults that fit the machine.

An action's cost is counted from the model's shape (``RecurrentConfig.cost``: every matmul and
causal attention, in FLOPs) plus its sandwich-block calls, and turned into seconds with this
machine's measured speeds (``recurrent_model.speed``): the FLOPs at the speed of ``F.linear`` on
the model's own weights, dtype and device, times ``default_overhead`` for the work around the
matmuls (norms, softmax, copies), and each block call at the measured cost of a tiny model's call.
Each estimate names the speed it used. After an action has run, its measured / estimated time
calibrates that action's later estimates on the same model (``CALIBRATION``).
"""

from __future__ import annotations

import importlib.util
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from recurrent_model.config import RecurrentConfig
from recurrent_model.speed import Speed, format_gflops

# forward time / (FLOPs at the F.linear speed + block calls) before any calibration, measured by
# bench/bench_app_cost.py: the norms, RoPE and softmax run below the matmul speed in float32; in
# half precision on a CPU the model's large products run faster than the probe's cut ones.
OVERHEAD = 1.2
HALF_CPU_OVERHEAD = 1.0
TIME_BUDGET_S = 20.0  # default steps and seeds keep the estimated collection under this
DEFAULT_STEPS, DEFAULT_SEEDS, MIN_STEPS = 32, 5, 4
STEP_CHOICES = (32, 24, 16, 12, 8, 6, 4)
COLLECT_BATCH = 8  # runs per forward in workbench.collect


def default_overhead(device: str, dtype: str) -> float:
    """The overhead to assume before a real run calibrates it (see OVERHEAD)."""
    half = dtype in ("bfloat16", "float16")
    return HALF_CPU_OVERHEAD if half and torch.device(device).type == "cpu" else OVERHEAD


def forward_flops(config: RecurrentConfig, tokens: int, num_steps: int, runs: int = 1) -> float:
    """FLOPs of `runs` forward passes over `tokens` tokens with `num_steps` core iterations
    (``RecurrentConfig.cost.forward_flops``: every matmul, the head at every position, causal
    attention)."""
    if tokens < 1 or num_steps < 1 or runs < 1:
        raise ValueError(f"tokens, steps and runs must be >= 1, got {tokens}, {num_steps}, {runs}")
    return runs * config.cost.forward_flops(tokens, num_steps)


def forward_calls(config: RecurrentConfig, num_steps: int, forwards: int = 1) -> int:
    """Sandwich-block calls of `forwards` forward passes at `num_steps` iterations."""
    return forwards * config.cost.layer_calls(num_steps)


def collection_calls(config: RecurrentConfig, num_steps: int, runs: int) -> int:
    """Block calls of a collection: one forward per batch of COLLECT_BATCH runs."""
    return forward_calls(config, num_steps, math.ceil(runs / COLLECT_BATCH))


@dataclass(frozen=True)
class CostEstimate:
    """An action's FLOPs, the measured speed it assumes (FLOP/s), and the estimated seconds.

    ``calls`` are its block calls (each at ``call_seconds``), ``speed`` the probe behind
    ``flops_per_second``, ``calibration`` the measured / estimated ratio of this action's last
    run that ``seconds`` includes (1 before any), and ``on_done(elapsed)`` records a finished run.
    """

    flops: float
    flops_per_second: float
    seconds: float
    calls: int = 0
    call_seconds: float = 0.0
    speed: Speed | None = None
    calibration: float = 1.0
    on_done: Callable[[float], None] | None = field(default=None, compare=False, repr=False)

    @property
    def uncalibrated_seconds(self) -> float:
        return self.seconds / self.calibration

    def describe(self) -> str:
        """E.g. "≈ 12 s (1.38 TFLOP at a measured 9.8 GFLOP/s)", and the calibration once there
        is one ("× 1.60 from the last run")."""
        size = (
            f"{self.flops / 1e12:.2f} TFLOP"
            if self.flops >= 1e11
            else f"{self.flops / 1e9:.2g} GFLOP"
        )
        text = f"{size} at a measured {format_gflops(self.flops_per_second)}"
        if self.calibration != 1.0:
            text += f", × {self.calibration:.2f} from the last run"
        when = f"≈ {self.seconds:.0f} s" if self.seconds >= 1 else "< 1 s"
        return f"{when} ({text})"

    def times(self, n: float) -> CostEstimate:
        """The same work done ``n`` times (no calibration callback: it is not one run)."""
        return replace(self, flops=n * self.flops, seconds=n * self.seconds,
                       calls=int(n * self.calls), on_done=None)  # fmt: skip

    def done(self, elapsed: float) -> None:
        """Record that the whole action took ``elapsed`` seconds (calibrates the next estimate)."""
        if self.on_done is not None:
            self.on_done(elapsed)


def estimate(
    flops: float,
    speed: Speed,
    calls: int = 0,
    call_seconds: float = 0.0,
    overhead: float = OVERHEAD,
    calibration: float = 1.0,
    extra_seconds: float = 0.0,
) -> CostEstimate:
    """Seconds = calibration × (overhead × flops / speed + calls × call_seconds + extra), where
    ``extra_seconds`` is work that is not the model's (building a lens's table)."""
    if speed.flops_per_second <= 0:
        raise ValueError(f"flops_per_second must be > 0, got {speed.flops_per_second}")
    seconds = overhead * flops / speed.flops_per_second + calls * call_seconds + extra_seconds
    return CostEstimate(flops, speed.flops_per_second, calibration * seconds, calls,
                        call_seconds, speed, calibration)  # fmt: skip


def combine(parts: list[CostEstimate]) -> CostEstimate:
    """Several estimates as one (e.g. a prompt and its decoded tokens): FLOPs, calls and seconds
    add up; the speed shown is the FLOP-weighted harmonic mean of the parts' speeds."""
    flops = sum(p.flops for p in parts)
    at_speed = sum(p.flops / p.flops_per_second for p in parts)
    first = parts[0]
    return replace(first, flops=flops, flops_per_second=flops / max(at_speed, 1e-30),
                   seconds=sum(p.seconds for p in parts), calls=sum(p.calls for p in parts))  # fmt: skip


class Calibration:
    """Measured / estimated time of each action's last run, per model (dropped with the model).

    A ratio is kept between 1/50 and 50, so a run cut short cannot make the next estimate absurd."""

    def __init__(self) -> None:
        self._ratios: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def ratio(self, model: object, action: str) -> float:
        with self._lock:
            try:
                return self._ratios.get(model, {}).get(action, 1.0)
            except TypeError:  # not weakly referable (a stand-in object): never calibrated
                return 1.0

    def record(self, model: object, action: str, uncalibrated: float, elapsed: float) -> None:
        if uncalibrated <= 0 or elapsed <= 0:
            return
        with self._lock:
            ratios = self._ratios.setdefault(model, {})
            ratios[action] = min(50.0, max(1 / 50, elapsed / uncalibrated))

    def recorder(
        self, model: object, action: str, uncalibrated: float
    ) -> Callable[[float], None] | None:
        """``on_done`` for an estimate: records against ``model`` without keeping it alive (None
        for an object that cannot be weakly referenced)."""
        try:
            ref = weakref.ref(model)
        except TypeError:
            return None

        def on_done(elapsed: float) -> None:
            held = ref()
            if held is not None:
                self.record(held, action, uncalibrated, elapsed)

        return on_done


CALIBRATION = Calibration()


def default_run(
    seconds: Callable[[int, int], float],
    budget: float = TIME_BUDGET_S,
    steps: int = DEFAULT_STEPS,
    seeds: int = DEFAULT_SEEDS,
) -> tuple[int, int]:
    """(steps, number of seeds) for the first run the app makes, from `seconds(steps, runs)`.

    Keeps `steps` and `seeds` when they fit the budget; else drops seeds first (one seed still
    shows a trajectory), then steps through STEP_CHOICES down to MIN_STEPS, which is used even
    when it does not fit (the user sees the estimate and can lower the tokens).
    """
    for n in range(seeds, 0, -1):
        if seconds(steps, n) <= budget:
            return steps, n
    for s in STEP_CHOICES:
        if s < steps and seconds(s, 1) <= budget:
            return s, 1
    return MIN_STEPS, 1


def format_bytes(n: float) -> str:
    """A byte count as GiB (from 1 GiB on) or MiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def patching_flops(
    config: RecurrentConfig, tokens: int, num_steps: int, patches: int, resume: bool = False
) -> float:
    """The clean and corrupted runs plus one forward per patch: a full one (at most), or with
    ``resume`` one that restarts at the patched step (its mean over steps 0 … r)."""
    if not resume:
        return forward_flops(config, tokens, num_steps, patches + 2)
    depths = range(num_steps + 1)
    mean = sum(config.cost.forward_flops(tokens, num_steps - s) for s in depths) / len(depths)
    return forward_flops(config, tokens, num_steps, 2) + patches * mean


def ablation_flops(config: RecurrentConfig, tokens: int, num_steps: int, n_random: int) -> float:
    """The plane fit's run, the base run, and one forward for the real and each random plane."""
    return forward_flops(config, tokens, num_steps, n_random + 3)


def generation_flops(
    config: RecurrentConfig, prompt_tokens: int, new_tokens: int, num_steps: int
) -> float:
    """At most: the prompt's forward, then one token per step of decoding at `num_steps`
    iterations (an adaptive exit stops earlier), attending to the whole context so far."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    decode = config.cost.forward_flops(new_tokens, num_steps, context=prompt_tokens)
    return forward_flops(config, prompt_tokens, num_steps) + decode


LENS_KINDS = ("coda", "logit")


def lens_flops(config: RecurrentConfig, tokens: int, num_steps: int, kind: str) -> float:
    """Decoding every state s_0 … s_r: the head alone (logit lens), or the coda and the head over
    the whole sequence at each step (coda lens)."""
    if kind not in LENS_KINDS:
        raise ValueError(f"kind must be 'coda' or 'logit', got {kind!r}")
    cost = config.cost
    per_state = 2.0 * tokens * cost.head_params
    if kind == "coda":
        coda = config.n_layers_in_coda
        per_state += 2.0 * tokens * coda * cost.block_matmul_params
        per_state += coda * cost.layer_attention_flops(tokens)
    return (num_steps + 1) * per_state


# A lens's table: per (position, step) row the top-k token strings, rank, KL and entropy, built in
# Python and pandas (bench/bench_app_cost.py).
LENS_ROW_S = 2.5e-4


def lens_calls(config: RecurrentConfig, num_steps: int, kind: str) -> int:
    """Block calls of a lens: the coda once per state (none for the logit lens), plus the final
    state's coda."""
    coda = config.n_layers_in_coda
    return coda * (num_steps + 2) if kind == "coda" else coda


HEAVY_SECONDS = 10.0  # an action estimated above this waits for a button instead of running


def largest_within(
    choices: tuple[int, ...], seconds: Callable[[int], float], budget: float = TIME_BUDGET_S
) -> int:
    """The largest of `choices` whose estimated `seconds(choice)` fits `budget` (else the
    smallest): a heavy action's default size scaled to the model and this device."""
    fitting = [c for c in choices if seconds(c) <= budget]
    return max(fitting) if fitting else min(choices)


BATCH_SECONDS = 3.0  # a heavy action's batch stays under this, so Stop acts within seconds


def batch_size_for(seconds_per_item: float, most: int, target: float = BATCH_SECONDS) -> int:
    """Items per batch (1 … `most`) so that a batch takes about `target` seconds: progress and
    cancellation are checked between batches."""
    if seconds_per_item <= 0:
        return most
    return int(min(most, max(1, target // seconds_per_item)))


def checkpoint_series_flops(
    config: RecurrentConfig,
    tokens: int,
    depths: tuple[int, ...],
    num_steps: int,
    seeds: int,
    checkpoints: int,
    texts: int = 1,
) -> float:
    """Per checkpoint and text: one loss forward at every depth, then a collection of `seeds`
    runs at `num_steps` (the dynamics, spread and correlation); loading a checkpoint is extra."""
    per_text = sum(forward_flops(config, tokens, d) for d in depths)
    per_text += forward_flops(config, tokens, num_steps, seeds)
    return checkpoints * texts * per_text


def checkpoint_series_calls(
    config: RecurrentConfig,
    depths: tuple[int, ...],
    num_steps: int,
    seeds: int,
    checkpoints: int,
    texts: int = 1,
) -> int:
    """Block calls of the series: the loss forwards and the collection, per checkpoint and text."""
    per_text = sum(forward_calls(config, d) for d in depths)
    per_text += collection_calls(config, num_steps, seeds)
    return checkpoints * texts * per_text


def diffusion_passes(new_tokens: int, num_steps: int, inner: int, headway: int) -> int:
    """Sampler steps when every position freezes after about `num_steps` core iterations: one
    step per `headway` new positions, and the last ones need num_steps / inner steps more."""
    return -(-new_tokens // headway) + -(-num_steps // inner)


def diffusion_wave(
    new_tokens: int, num_steps: int, inner: int, headway: int, max_wavefront: int = 128
) -> int:
    """Positions in the wave under the same assumption: `headway` join per step and each stays
    about num_steps / inner steps (cut at `max_wavefront`, and at most the new tokens)."""
    return min(max_wavefront, headway * -(-num_steps // inner), new_tokens)


def diffusion_flops(
    config: RecurrentConfig,
    prompt_tokens: int,
    new_tokens: int,
    num_steps: int,
    inner: int,
    headway: int,
    max_wavefront: int = 128,
) -> float:
    """The prompt's prefill, then per sampler step a pass of `inner` iterations over the wave's
    `diffusion_wave` positions, attending to the whole context so far. An estimate: positions
    that freeze later (a small exit_t) cost more passes."""
    passes = diffusion_passes(new_tokens, num_steps, inner, headway)
    wave = diffusion_wave(new_tokens, num_steps, inner, headway, max_wavefront)
    context = prompt_tokens + new_tokens / 2 - wave  # keys before the wave, on average
    per_pass = config.cost.forward_flops(wave, inner, context=max(0, round(context)))
    return forward_flops(config, prompt_tokens, num_steps) + passes * per_pass


def diffusion_calls(
    config: RecurrentConfig, new_tokens: int, num_steps: int, inner: int, headway: int
) -> int:
    """Block calls of a diffusion sampling: the prefill and one forward per sampler pass."""
    passes = diffusion_passes(new_tokens, num_steps, inner, headway)
    return forward_calls(config, num_steps) + forward_calls(config, inner, passes)


# UMAP runs on the recorded states, not the model: its time is the states' count at a per-state
# cost, plus, for the first fit in a process, umap's import and numba's compilation (or the load
# of numba's on-disk cache of it). Measured by bench/bench_app_cost.py on a 2-core CPU.
UMAP_STATE_S = 4e-3
UMAP_IMPORT_S = 20.0
UMAP_COMPILE_S = 80.0


def numba_cache_present(package: str = "pynndescent") -> bool:
    """True when numba has cached compiled functions for ``package`` (no import needed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(next(Path(p).rglob("*.nbi"), None) for p in spec.submodule_search_locations)


def umap_seconds(states: int, kind: str = "umap") -> tuple[float, str]:
    """The estimated seconds of a UMAP fit (``kind`` "umap", or "aligned" for AlignedUMAP) over
    ``states`` states, and what the figure includes (the fit runs in apps.umap_worker's process:
    its first fit of each kind imports umap there and compiles that kind's functions)."""
    from .umap_worker import WORKER

    fit = 1.0 + UMAP_STATE_S * states
    if kind in WORKER.fitted:
        return fit, "umap is loaded"
    if numba_cache_present():
        return fit + UMAP_IMPORT_S, "with umap's import and numba's cached compilation"
    return fit + UMAP_COMPILE_S, "with umap's import and numba's first compilation"


_UMAP_RATIOS: dict[tuple[str, bool], float] = {}


@dataclass(frozen=True)
class TimeEstimate:
    """The estimate of work that is not the model's (a UMAP fit): seconds, what they include,
    and the measured / estimated time of the last such fit (``calibration``) they include."""

    seconds: float
    includes: str
    calibration: float = 1.0
    on_done: Callable[[float], None] | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        again = f", × {self.calibration:.2f} from the last fit" if self.calibration != 1.0 else ""
        return f"≈ {self.seconds:.0f} s ({self.includes}{again})"

    def done(self, elapsed: float) -> None:
        if self.on_done is not None:
            self.on_done(elapsed)


def umap_estimate(states: int, kind: str = "umap") -> TimeEstimate:
    """`umap_seconds`, calibrated by the last fit of the same kind, umap loaded or not."""
    seconds, includes = umap_seconds(states, kind)
    key = (kind, includes == "umap is loaded")
    ratio = _UMAP_RATIOS.get(key, 1.0)

    def record(elapsed: float) -> None:
        _UMAP_RATIOS[key] = min(50.0, max(1 / 50, elapsed / seconds))

    return TimeEstimate(ratio * seconds, includes, ratio, record)
