"""Forward throughput vs the machine's matmul throughput, hook-recording overhead, training memory.

Everything is measured side by side in one process:
1. float32 forward at h=256 and h=512, T=256, r=32: the forward's FLOP/s (linear layers + causal
   attention) as a fraction of the FLOP/s F.linear reaches on exactly the model's matmul shapes.
   The same after ``model.compile_blocks()`` (inductor fuses the elementwise work).
2. run_with_cache recording only core.hook_state vs a plain forward (h=256, T=256, r=32).
3. Peak training memory (forward + backward) at r̄=32 vs r̄=8 with k=8, each in a fresh subprocess.

Usage: python bench/bench_forward.py [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import recurrent_model as rm
from recurrent_model import hook_names


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_config(h: int) -> rm.RecurrentConfig:
    return rm.preset(
        "small", n_embd=h, n_heads=h // 64, intermediate_size=int(h * 2.75), vocab_size=4096
    )


def matmul_shapes(
    cfg: rm.RecurrentConfig, tokens: int, steps: int
) -> list[tuple[int, int, int, int]]:
    """(m, k, n, count) for every matmul of one forward (the model's linear layers, from
    ``cfg.cost``: each block projection once per layer call, the adapter per step, the head)."""
    calls = cfg.cost.layer_calls(steps)
    shapes = [(tokens, k, n, calls) for n, k in cfg.cost.block_shapes().values()]
    shapes.append((tokens, *reversed(cfg.cost.weight_shapes()["adapter"]), steps))
    shapes.append((tokens, *reversed(cfg.cost.weight_shapes()["head"]), 1))
    return shapes


def attention_flops(cfg: rm.RecurrentConfig, tokens: int, steps: int) -> float:
    """Causal QKᵀ and AV of every layer call (``cfg.cost``)."""
    return cfg.cost.attention_flops(tokens, steps)


def matmul_time(shapes, repeats: int) -> tuple[float, float]:
    """Seconds F.linear (the model's product) needs for these shapes, and the FLOPs they are."""
    total, flops = 0.0, 0.0
    for m, k, n, count in shapes:
        a, w = torch.randn(m, k), torch.randn(n, k)
        t = best_time(lambda a=a, w=w: torch.nn.functional.linear(a, w), repeats * 3)
        total += t * count
        flops += 2 * m * k * n * count
    return total, flops


def forward_efficiency(h: int, tokens: int, steps: int, repeats: int) -> dict:
    torch.manual_seed(0)
    cfg = bench_config(h)
    model = rm.RecurrentLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, tokens))
    with torch.no_grad():
        fwd = best_time(lambda: model(ids, num_steps=steps), repeats)
        rec = best_time(
            lambda: model.run_with_cache(ids, num_steps=steps, names_filter=hook_names.STATE),
            repeats,
        )
        fwd_again = best_time(lambda: model(ids, num_steps=steps), repeats)
        model.compile_blocks(dynamic=False)
        compiled = best_time(lambda: model(ids, num_steps=steps), repeats)
    fwd = min(fwd, fwd_again)
    mm_time, mm_flops = matmul_time(matmul_shapes(cfg, tokens, steps), repeats)
    model_gflops = (mm_flops + attention_flops(cfg, tokens, steps)) / fwd / 1e9
    matmul_gflops = mm_flops / mm_time / 1e9
    return {
        "h": h,
        "forward_s": fwd,
        "matmul_s": mm_time,
        "efficiency": model_gflops / matmul_gflops,
        "compiled_s": compiled,
        "compiled_efficiency": model_gflops * fwd / compiled / matmul_gflops,
        "model_gflops": model_gflops,
        "matmul_gflops": matmul_gflops,
        "record_s": rec,
        "record_overhead": rec / fwd - 1,
    }


MEMORY_SCRIPT = """
import resource, sys, torch, recurrent_model as rm
torch.set_num_threads(2)
mean, k = int(sys.argv[1]), int(sys.argv[2])
cfg = rm.preset("small", n_embd=256, n_heads=4, intermediate_size=704, vocab_size=4096,
                mean_recurrence=mean, mean_backprop_depth=k)
model = rm.RecurrentLM(cfg).train()
ids = torch.randint(0, cfg.vocab_size, (4, 256))
model(ids, num_steps=2, labels=ids).loss.backward()   # allocator warm-up at tiny depth
model.zero_grad(set_to_none=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model(ids, num_steps=mean, backprop_depth=k, labels=ids).loss.backward()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, base * 1024)
"""


def training_peak_memory(mean: int, k: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(mean), str(k)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [forward_efficiency(h, args.tokens, args.steps, args.repeats) for h in (256, 512)]
    mem32, mem8 = training_peak_memory(32, 8), training_peak_memory(8, 8)
    if args.json:
        print(json.dumps({"forward": results, "peak_rss_32": mem32, "peak_rss_8": mem8}))
        return
    print(f"threads={args.threads} T={args.tokens} r={args.steps} float32")
    print(
        f"{'h':>5} {'forward s':>10} {'matmul s':>9} {'fwd/mm':>7} {'model GF/s':>10} "
        f"{'mm GF/s':>8} {'compiled s':>10} {'compiled/mm':>11}"
    )
    for r in results:
        print(
            f"{r['h']:>5} {r['forward_s']:>10.3f} {r['matmul_s']:>9.3f} {r['efficiency']:>7.1%} "
            f"{r['model_gflops']:>10.1f} {r['matmul_gflops']:>8.1f} {r['compiled_s']:>10.3f} "
            f"{r['compiled_efficiency']:>11.1%}"
        )
    for r in results:
        print(
            f"recording core.hook_state at h={r['h']}: {r['record_overhead']:+.1%} vs plain forward"
        )
    print(
        f"training peak RSS r̄=32,k=8: {mem32 / 2**20:.0f} MiB; r̄=8,k=8: {mem8 / 2**20:.0f} MiB; "
        f"ratio {mem32 / mem8:.3f}"
    )


if __name__ == "__main__":
    main()
