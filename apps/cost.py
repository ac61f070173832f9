"""What a trajectory collection will cost before it starts, and run defaults that fit the machine.

The cost is counted in FLOPs from the model's shape (every matmul of a forward pass: the prelude and
coda once, the adapter and core block once per iteration, the head, and causal attention), and
turned into seconds at the speed of this device measured once per (device, dtype, shape) with a
matmul probe in the model's dtype. A forward does more than matmuls (norms, RoPE, copying the
recorded states), so `default_overhead` scales the matmul time; after a real collection the app
passes the measured ratio instead (`estimate_seconds(..., overhead=...)`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch

from recurrent_model.config import RecurrentConfig

# forward time / matmul-probe time before any calibration (bench/bench_app_cost.py, README): about
# 1.1–1.3 in float32 at h >= 1024 (2.3 for the tiny default checkpoint), about 3.2 in bfloat16 on
# a CPU, where the norms, RoPE and softmax run far below the matmul speed.
OVERHEAD = 1.2
HALF_CPU_OVERHEAD = 3.2
TIME_BUDGET_S = 20.0  # default steps and seeds keep the estimated collection under this
DEFAULT_STEPS, DEFAULT_SEEDS, MIN_STEPS = 32, 5, 4
STEP_CHOICES = (32, 24, 16, 12, 8, 6, 4)


def layer_matmul_params(config: RecurrentConfig) -> int:
    """Weights one sandwich block multiplies by: Wqkv (h × 3h), proj (h × h), gated MLP (3 h I)."""
    h = config.n_embd
    return 4 * h * h + 3 * h * config.intermediate_size


def default_overhead(device: str, dtype: str) -> float:
    """The overhead to assume before a real collection calibrates it (see OVERHEAD)."""
    half = dtype in ("bfloat16", "float16")
    return HALF_CPU_OVERHEAD if half and torch.device(device).type == "cpu" else OVERHEAD


def forward_flops(config: RecurrentConfig, tokens: int, num_steps: int, runs: int = 1) -> float:
    """FLOPs of `runs` forward passes over `tokens` tokens with `num_steps` core iterations.

    2 FLOPs per weight and token for the prelude, the coda, the head (logits at every position)
    and, per iteration, the adapter (2h × h) and the core block; attention adds 2 × 2 T h per
    layer and token on average (QKᵀ and AV over a causal context of (T + 1) / 2 positions).
    """
    if tokens < 1 or num_steps < 1 or runs < 1:
        raise ValueError(f"tokens, steps and runs must be >= 1, got {tokens}, {num_steps}, {runs}")
    h = config.n_embd
    layer = layer_matmul_params(config)
    once = (config.n_layers_in_prelude + config.n_layers_in_coda) * layer + config.vocab_size * h
    per_step = config.n_layers_in_recurrent_block * layer + 2 * h * h
    layers = (
        config.n_layers_in_prelude
        + config.n_layers_in_coda
        + num_steps * config.n_layers_in_recurrent_block
    )
    matmuls = 2.0 * tokens * (once + num_steps * per_step)
    attention = 2.0 * layers * tokens * (tokens + 1) * h
    return runs * (matmuls + attention)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@lru_cache(maxsize=32)
def matmul_flops_per_second(
    device: str, dtype: str, rows: int, h: int, min_seconds: float = 0.2
) -> float:
    """Measured FLOP/s of (rows × h) @ (h × h) in `dtype` on `device` (cached per arguments).

    Repeats the product until `min_seconds` have passed (at least 3 times, at most 200), after a
    warm-up; the shapes are those of a forward over `rows` token states.
    """
    dev, dt = torch.device(device), getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, h, generator=gen).to(dev, dt)
    b = torch.randn(h, h, generator=gen).to(dev, dt)
    with torch.inference_mode():
        a @ b  # warm-up
        _sync(dev)
        reps, start = 0, time.perf_counter()
        while reps < 3 or (time.perf_counter() - start < min_seconds and reps < 200):
            a @ b
            reps += 1
        _sync(dev)
        elapsed = time.perf_counter() - start
    return 2.0 * rows * h * h * reps / max(elapsed, 1e-9)


@dataclass(frozen=True)
class CostEstimate:
    """A collection's FLOPs, the probe's speed (FLOP/s) and the estimated seconds."""

    flops: float
    flops_per_second: float
    seconds: float

    def describe(self) -> str:
        return (
            f"≈ {self.seconds:.0f} s ({self.flops / 1e12:.2f} TFLOP at a measured "
            f"{self.flops_per_second / 1e9:.0f} GFLOP/s)"
            if self.seconds >= 1
            else f"< 1 s ({self.flops / 1e9:.1f} GFLOP at a measured "
            f"{self.flops_per_second / 1e9:.0f} GFLOP/s)"
        )


def estimate_seconds(
    config: RecurrentConfig,
    tokens: int,
    num_steps: int,
    runs: int,
    flops_per_second: float,
    overhead: float = OVERHEAD,
) -> CostEstimate:
    """The estimated cost of collecting `runs` runs of `num_steps` iterations over `tokens`."""
    if flops_per_second <= 0:
        raise ValueError(f"flops_per_second must be > 0, got {flops_per_second}")
    flops = forward_flops(config, tokens, num_steps, runs)
    return CostEstimate(flops, flops_per_second, overhead * flops / flops_per_second)


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


def patching_flops(config: RecurrentConfig, tokens: int, num_steps: int, patches: int) -> float:
    """At most: the clean and corrupted runs plus one full forward per patch (a patch that resumes
    from the cached state at its step runs fewer iterations)."""
    return forward_flops(config, tokens, num_steps, patches + 2)


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
    layers = (
        config.n_layers_in_prelude
        + config.n_layers_in_coda
        + num_steps * config.n_layers_in_recurrent_block
    )
    per_token = forward_flops(config, 1, num_steps) - 4.0 * layers * config.n_embd
    context = prompt_tokens * new_tokens + new_tokens * (new_tokens + 1) / 2  # keys attended
    attention = 4.0 * layers * config.n_embd * context
    return forward_flops(config, prompt_tokens, num_steps) + new_tokens * per_token + attention


def lens_flops(config: RecurrentConfig, tokens: int, num_steps: int, kind: str) -> float:
    """Decoding every state s_0 … s_r: the head alone (logit lens), or the coda and the head over
    the whole sequence at each step (coda lens)."""
    h, head = config.n_embd, config.vocab_size * config.n_embd
    per_state = 2.0 * tokens * head
    if kind == "coda":
        coda = config.n_layers_in_coda
        per_state += 2.0 * tokens * coda * layer_matmul_params(config)
        per_state += 2.0 * coda * tokens * (tokens + 1) * h
    elif kind != "logit":
        raise ValueError(f"kind must be 'coda' or 'logit', got {kind!r}")
    return (num_steps + 1) * per_state


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
    layers = (
        config.n_layers_in_prelude
        + config.n_layers_in_coda
        + inner * config.n_layers_in_recurrent_block
    )
    per_pass = forward_flops(config, wave, inner) - 2.0 * layers * wave * (wave + 1) * config.n_embd
    context = prompt_tokens + new_tokens / 2  # keys a wave position attends to on average
    attention = 4.0 * layers * config.n_embd * wave * context
    return forward_flops(config, prompt_tokens, num_steps) + passes * (per_pass + attention)
