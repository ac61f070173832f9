"""What the stability analyses cost, as ratios from one run (timings are noisy on a shared CPU).

1. k = 8 Lyapunov exponents over 64 steps for one token, as a multiple of one forward at the same
   depth (64 core iterations over the same prompt); the goal is <= 3·k.
2. Anderson's core passes against plain iteration to 1e-5 (and 1e-4), whole sequence, over the default
   prompts.
3. The same at the 3.5B shape (preset "huginn-0125": random weights, bfloat16, CPU, one token): only
   the adapter and the core block are built (the rest is never touched by the core map). One core
   pass and one step of k batched JVPs are timed; the k = 8, 64-step cost is extrapolated from them
   (printed as an estimate); Anderson and plain iteration run for at most ``--big-passes`` passes
   to 1e-2 (bfloat16 rounding sits near 1e-3).

4. ``--findings`` (instead of 1–3): the numbers docs/stability.md quotes. Every token's block λ_1 on
   the default prompts from a random s_0 (init_scale 1, seed 0) at 48 steps (the last 24 averaged)
   and at twice that, with batch-means errors and the neutral count; the numpy-docstring prompt's
   λ_1 at 48, 96, 128 and 256 steps; the stretch attribution of 4 tokens per prompt after 16
   iterations, relative (scale-free) and absolute, mean and range per sub-layer.

    .venv/bin/python bench/bench_stability.py [--checkpoint checkpoints/default] [--skip-big]
    .venv/bin/python bench/bench_stability.py --findings
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import recurrent_model as rm
from recurrent_model import functional as fn
from workbench.core_map import CoreMap, initial_state
from workbench.fixed_point import anderson, plain_passes, worst_residual
from workbench.lyapunov import batched_jvp, estimate, is_neutral, lyapunov_run, token_stretches
from workbench.stretch_attribution import stretch_attribution

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = (
    "Claire makes a 3 egg omelet every morning for breakfast. How many dozens of eggs will she eat "
    "in 4 weeks?",
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    return min(value, high)\n",
    "Question: Claire makes a 3 egg omelet every morning. How many eggs does she eat in 4 weeks?\nAnswer:",
    "37 + 48 = 85\n12 * 7 = 84\n245 + 381 = 626",
    "a = 3\nb = a + 4\nc = b * 2\nprint(c)\n# output: 14",
)  # the app's default prompt and the training-dynamics notebook's texts
DOCSTRING = (
    "random_sample        Alias for `random_sample`\n"
    "randint              Uniformly distributed integers in a given range\n"
    "seed                 Seed the legacy random number generator.\n"
)  # the orbits notebook's prompt: 50 of its 55 tokens orbit
K, STEPS, TOL = 8, 64, 1e-5
#: bfloat16 keeps 8 mantissa bits, so a residual below ~1e-3 is rounding: the big shape's tolerance.
BIG_TOL = 1e-2


def best_of(repeats: int, work) -> float:
    """The fastest of ``repeats`` timed calls (the least disturbed by other processes)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times)


def lyapunov_cost(model: rm.RecurrentLM, repeats: int) -> None:
    ids = model.tokenizer.encode(PROMPTS[0])
    position = len(ids) // 2
    x = torch.tensor([ids])
    with torch.no_grad():
        forward = best_of(repeats, lambda: model(x, num_steps=STEPS, init_scale=0.0))
    lyap = best_of(repeats, lambda: lyapunov_run(model, ids, STEPS, position=position, k=K))
    print(f"[1] k={K} exponents over {STEPS} steps, token {position} of {len(ids)}: {lyap:.3f} s; "
          f"one forward at depth {STEPS}: {forward:.3f} s; ratio {lyap / forward:.1f} "
          f"(goal <= {3 * K})")  # fmt: skip


def anderson_vs_plain(model: rm.RecurrentLM, max_iter: int, tol: float) -> None:
    total_a = total_p = 0
    for i, text in enumerate(PROMPTS):
        ids = model.tokenizer.encode(text)
        core = CoreMap.from_model(model, ids)
        start = initial_state(model, core, 0.0, 0)
        solved = anderson(core, start, tol, max_iter)
        plain = plain_passes(core, start, tol, max_iter)
        shown = plain if plain is not None else f">{max_iter}"
        print(f"[2] tol {tol:g}, prompt {i} ({len(ids)} tokens): Anderson {solved.passes} passes "
              f"(converged {solved.converged}), plain {shown}")  # fmt: skip
        total_a += solved.passes
        total_p += plain if plain is not None else max_iter
    print(f"[2] all prompts to {tol:g}: Anderson {total_a} passes, plain {total_p} "
          f"(a capped count is a lower bound): {total_p / total_a:.1f}x fewer")  # fmt: skip


def clamped_normal(shape, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std²) clamped at ±3 std, drawn in bfloat16 (a truncated normal's scale, built fast)."""
    w = torch.randn(shape, generator=generator, dtype=torch.bfloat16)
    return w.clamp_(-3.0, 3.0).mul_(std)


def big_core_map(tokens: int = 1, seed: int = 0) -> CoreMap:
    """The huginn-0125 adapter and core block with random Takase-scaled weights, all in bfloat16."""
    config = rm.preset("huginn-0125")
    h, g = config.n_embd, torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = rm.RecurrentLM(config, init_weights=False)
    blocks = []
    for block in model.transformer.core_block:
        shapes = {name: p.shape for name, p in block.named_parameters()}
        weights = {}
        for name, shape in shapes.items():
            if ".norm_" in f".{name}" or name.startswith("norm_"):
                weights[name] = torch.ones(shape, dtype=torch.bfloat16)
            elif name.endswith("qk_bias"):
                weights[name] = torch.zeros(shape, dtype=torch.bfloat16)
            else:
                std = config.out_proj_std if name.endswith("proj.weight") else config.init_std
                weights[name] = clamped_normal(shape, std, g)
        block_module = block.to_empty(device="cpu").to(torch.bfloat16)  # parameters in bf16 too
        block_module.load_state_dict(weights)
        blocks.append(block_module.weights())
    adapter = clamped_normal((h, 2 * h), config.init_std, g)
    e = (torch.randn(tokens, h, generator=g) * config.init_std * h**0.5).bfloat16()
    rope = fn.rope_table(config.head_dim, tokens, config.rope_base)
    return CoreMap(e, adapter, blocks, rope, config.norm_eps)


def big_shape(passes: int) -> None:
    t0 = time.perf_counter()
    core = big_core_map()
    print(
        f"[3] huginn-0125 core map built in {time.perf_counter() - t0:.0f} s (bf16, CPU, 1 token)"
    )
    state = torch.zeros(core.shape, dtype=torch.bfloat16)
    with torch.no_grad():
        one_pass = best_of(2, lambda: core(state))
    point = state[0]
    block = core.block(0, state)
    tangents = torch.randn(K, core.shape[1]).bfloat16()
    jvp_step = best_of(1, lambda: batched_jvp(block, point, tangents))
    estimate = STEPS * (one_pass + jvp_step)
    print(f"[3] one core pass {one_pass:.2f} s; {K} batched JVPs {jvp_step:.2f} s "
          f"({jvp_step / one_pass:.1f} passes); ESTIMATE for k={K} over {STEPS} steps: "
          f"{estimate:.0f} s = {estimate / (STEPS * one_pass):.1f} forwards at depth {STEPS}")  # fmt: skip
    solved = anderson(core, state, BIG_TOL, passes)
    plain = plain_passes(core, state, BIG_TOL, passes)
    with torch.no_grad():
        floor = worst_residual(solved.state, core(solved.state))
    print(f"[3] to {BIG_TOL:g} within {passes} passes: Anderson {solved.passes} passes, converged "
          f"{solved.converged} (residual {floor:.1e}); plain "
          f"{plain if plain is not None else f'>{passes}'}")  # fmt: skip


def prompt_stretches(model: rm.RecurrentLM, text: str, steps: int) -> np.ndarray:
    """(steps, T) per-step block stretches of every token from the seed-0 random s_0."""
    core = CoreMap.from_model(model, model.tokenizer.encode(text))
    return token_stretches(core, initial_state(model, core, 1.0, 0), steps)


def exponent_findings(model: rm.RecurrentLM, steps: int = 48) -> None:
    """λ_1 of every token at ``steps`` and 2·``steps`` with errors; the docstring source token."""
    found = {steps: [], 2 * steps: []}
    for text in PROMPTS:
        stretches = prompt_stretches(model, text, 2 * steps)
        for n in found:
            found[n].append(estimate(stretches[:n], n // 2))
    for n, parts in found.items():
        lam = np.concatenate([m for m, _ in parts])
        err = np.concatenate([e for _, e in parts])
        top = int(lam.argmax())
        print(f"[4] default prompts, {len(lam)} tokens, {n} steps (last {n - n // 2}): λ_1 from "
              f"{lam.min():.3f} to {lam[top]:.3f} ± {err[top]:.3f}, median {np.median(lam):.3f}; "
              f"negative {int((lam < 0).sum())}, neutral {int(is_neutral(lam, err).sum())}")  # fmt: skip
    stretches = prompt_stretches(model, DOCSTRING, 256)
    for n in (48, 96, 128, 256):
        lam, err = estimate(stretches[:n], n // 2)
        top = int(lam.argmax())
        print(f"[4] docstring prompt, {n} steps: largest λ_1 token {top}: {lam[top]:+.4f} ± "
              f"{err[top]:.4f} (neutral {bool(is_neutral(lam[top], err[top]))}); neutral tokens "
              f"{int(is_neutral(lam, err).sum())} of {len(lam)}")  # fmt: skip


def attribution_findings(model: rm.RecurrentLM, per_prompt: int = 4, steps: int = 16) -> None:
    """Relative and absolute attribution per sub-layer, mean (range) over sampled tokens."""
    frames = []
    for text in PROMPTS:
        ids = model.tokenizer.encode(text)
        for position in np.linspace(1, len(ids) - 1, per_prompt).round().astype(int):
            frames.append(stretch_attribution(model, ids, position=int(position),
                                              num_steps=steps, init_scale=1.0))  # fmt: skip
    table = pd.concat(frames)
    print(f"[4] attribution after {steps} iterations, {len(frames)} tokens (positions spread "
          f"over each prompt, token 0 left out), mean (min … max):")  # fmt: skip
    for column in ("relative", "log_stretch", "log_scale"):
        stats = table.groupby("sublayer", sort=False)[column].agg(["mean", "min", "max"])
        parts = [f"{name} {r['mean']:+.2f} ({r['min']:+.2f} … {r['max']:+.2f})"
                 for name, r in stats.iterrows()]  # fmt: skip
        print(f"[4]   {column}: " + ", ".join(parts))
    totals = [(f.attrs["total_relative"], f.attrs["total"]) for f in frames]
    rel, ab = np.array(totals).T
    print(f"[4]   totals: relative {rel.mean():+.3f}, absolute {ab.mean():+.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "default"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-iter", type=int, default=500)
    parser.add_argument("--big-passes", type=int, default=40)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--only-big", action="store_true")
    parser.add_argument("--findings", action="store_true", help="the numbers of docs/stability.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = rm.load_model(args.checkpoint).eval()
    print(
        f"{model.name}: {model.config.shape_summary()} (one thread; shared CPU, timings are noisy)"
    )
    if args.only_big:
        big_shape(args.big_passes)
        return
    if args.findings:
        attribution_findings(model)
        exponent_findings(model)
        return
    lyapunov_cost(model, args.repeats)
    for tol in (
        TOL,
        1e-4,
    ):  # 1e-4: above the float32 floor plain iteration stalls at on slow tokens
        anderson_vs_plain(model, args.max_iter, tol)
    if not args.skip_big:
        big_shape(args.big_passes)


if __name__ == "__main__":
    main()
