"""Training throughput and memory on this CPU, as ratios measured side by side in one run.

1. Throughput: training steps (forward + truncated backward + the recipe's optimizer step) of a
   matmul-heavy recurrent model at a fixed depth; achieved model FLOP/s (pretrain.metrics
   .flops_per_token, no recompute counted) as a fraction of the CPU's float32 matmul throughput,
   measured right before and after every step with the same thread count (target >= 60%).
2. Memory: peak RSS of one training step at r = 32 (24 no-grad + 8 grad iterations) vs r = 8
   (8 grad) with k = 8, each in a fresh subprocess (target <= 1.15x). Also the increment over the
   RSS before the step (activations, gradients, optimizer moments), without the model and runtime.

Usage: python bench/bench_train.py [--steps 3] [--hidden 1024] [--compile] [--skip-memory] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain.metrics import flops_per_token, measure_cpu_matmul_flops  # noqa: E402
from pretrain.optimizer import (  # noqa: E402
    ClippedAtanAdam,
    clip_grads_,
    global_grad_norm,
    parameter_groups,  # noqa: E402
)
from recurrent_model import Depth, RecurrentLM, preset  # noqa: E402


def bench_model(hidden: int, block: int, mean_recurrence: int = 8, k: int = 8) -> RecurrentLM:
    config = preset(
        "small",
        n_embd=hidden,
        n_heads=max(1, hidden // 128),
        intermediate_size=int(hidden * 2.75) // 64 * 64,
        vocab_size=4096,
        block_size=block,
        mean_recurrence=mean_recurrence,
        mean_backprop_depth=k,
    )
    torch.manual_seed(0)
    return RecurrentLM(config).train()


def train_step(model, optimizer, inputs, depth: Depth) -> None:
    out = model(inputs, num_steps=depth.total, labels=inputs, backprop_depth=depth.grad)
    out.loss.backward()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    clip_grads_(params, 1.0, global_grad_norm(params))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def throughput(
    steps: int, hidden: int, batch: int, block: int, depth: Depth, compile_blocks: bool = False
) -> dict:
    model = bench_model(hidden, block)
    if compile_blocks:  # as train.compile does: every sandwich block compiled in place
        t = model.transformer
        for b in [*t.prelude, *t.core_block, *t.coda]:
            b.compile()
    optimizer = ClippedAtanAdam(parameter_groups(model, 1e-4), lr=1e-4)
    inputs = torch.randint(0, model.config.vocab_size, (batch, block))
    train_step(model, optimizer, inputs, depth)  # warm-up (and compilation)
    train_step(model, optimizer, inputs, depth)
    flops = flops_per_token(model.config, depth, block) * batch * block
    ratios, rates, peaks = [], [], []
    for _ in range(steps):
        before = measure_cpu_matmul_flops(seconds=0.6)
        start = time.perf_counter()
        train_step(model, optimizer, inputs, depth)
        elapsed = time.perf_counter() - start
        after = measure_cpu_matmul_flops(seconds=0.6)
        achieved = flops / elapsed
        peak = (before + after) / 2
        ratios.append(achieved / peak)
        rates.append(batch * block / elapsed)
        peaks.append(peak)
    return {
        "params_m": model.num_parameters() / 1e6,
        "hidden": hidden,
        "tokens_per_step": batch * block,
        "depth": list(depth),
        "tokens_per_s": statistics.median(rates),
        "achieved_gflops": statistics.median(ratios) * statistics.median(peaks) / 1e9,
        "matmul_peak_gflops": statistics.median(peaks) / 1e9,
        "fraction_of_matmul_peak": statistics.median(ratios),
        "threads": torch.get_num_threads(),
        "compiled": compile_blocks,
    }


def memory_child(total: int, k: int) -> None:
    """Run in a fresh process: one training step at depth ``total`` with ``k`` grad iterations."""
    model = bench_model(256, 256, mean_recurrence=total, k=k)
    optimizer = ClippedAtanAdam(parameter_groups(model, 1e-4), lr=1e-4)
    inputs = torch.randint(0, 4096, (8, 256))
    depth = Depth(max(total - k, 0), min(total, k))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # model, inputs, runtime
    train_step(model, optimizer, inputs, depth)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"base_kib": base, "peak_kib": peak}))


def memory(k: int = 8) -> dict:
    results = {}
    for total in (8, 32):
        proc = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(total), str(k)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[total] = json.loads(proc.stdout.strip().splitlines()[-1])
    r8, r32 = results[8], results[32]
    grow8 = r8["peak_kib"] - r8["base_kib"]
    grow32 = r32["peak_kib"] - r32["base_kib"]
    return {
        "peak_rss_mib_r8": r8["peak_kib"] / 1024,
        "peak_rss_mib_r32": r32["peak_kib"] / 1024,
        "peak_ratio_r32_vs_r8": r32["peak_kib"] / r8["peak_kib"],
        "step_increment_mib_r8": grow8 / 1024,
        "step_increment_mib_r32": grow32 / 1024,
        "increment_ratio_r32_vs_r8": grow32 / max(grow8, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--compile", action="store_true", help="compile the blocks (train.compile)")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--memory-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child)
        return
    report = {
        "throughput": throughput(args.steps, args.hidden, args.batch, args.block, Depth(2, 2))
    }
    if not args.skip_memory:
        report["memory"] = memory()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    t = report["throughput"]
    print(
        f"training throughput ({'compiled blocks' if t['compiled'] else 'eager'}), "
        f"{t['params_m']:.1f}M params (h={t['hidden']}, depth 2+2, "
        f"{t['tokens_per_step']} tokens/step, {t['threads']} threads):"
    )
    print(
        f"  {t['tokens_per_s']:.0f} tokens/s, {t['achieved_gflops']:.1f} GFLOP/s = "
        f"{100 * t['fraction_of_matmul_peak']:.0f}% of the measured float32 matmul peak "
        f"({t['matmul_peak_gflops']:.1f} GFLOP/s)  [target >= 60%]"
    )
    if "memory" in report:
        m = report["memory"]
        print("peak memory of a training step with k = 8 (h = 256, 8 x 256 tokens):")
        print(
            f"  r = 8: {m['peak_rss_mib_r8']:.0f} MiB, r = 32: {m['peak_rss_mib_r32']:.0f} MiB "
            f"-> {m['peak_ratio_r32_vs_r8']:.3f}x  [target <= 1.15x]"
        )
        print(
            f"  step increment over the pre-step RSS: {m['step_increment_mib_r8']:.0f} vs "
            f"{m['step_increment_mib_r32']:.0f} MiB -> {m['increment_ratio_r32_vs_r8']:.3f}x"
        )


if __name__ == "__main__":
    main()
