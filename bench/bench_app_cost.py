"""How close the app's cost estimate comes to the real collection time.

For a few model shapes (the default checkpoint, and random models of larger widths in float32 and
bfloat16), prints the estimate of apps/cost.py before calibration (FLOPs at the matmul-probe speed,
overhead 1), the measured time of `workbench.collect` on the same run, and their ratio: the app
multiplies later estimates by this ratio once it has seen one real collection. The machine may be
shared: the probe and the run are measured side by side, one right after the other.

Usage: python bench/bench_app_cost.py [--tokens 46] [--steps 8] [--seeds 2]
"""

from __future__ import annotations

import argparse
import time

import torch

import recurrent_model as rm
import workbench
from apps import compute
from recurrent_model.config import RecurrentConfig
from recurrent_model.threads import threads_for

SHAPES = {
    "h=1024 (2,4,2)": dict(n_embd=1024, n_heads=8, intermediate_size=3584, vocab_size=32768),
    "h=2048 (2,4,2)": dict(n_embd=2048, n_heads=16, intermediate_size=7168, vocab_size=32768),
}


def measure(model: rm.RecurrentLM, name: str, tokens: int, steps: int, seeds: int) -> None:
    ids = list(range(5, 5 + tokens))
    guess = compute.estimate(model, tokens, steps, seeds, overhead=1.0)
    with threads_for(model):
        start = time.perf_counter()
        workbench.collect(model, ids, steps, seeds=range(seeds), progress=False)
        took = time.perf_counter() - start
    print(
        f"{name:28s} {str(model.dtype):15s} estimate {guess.seconds:7.2f} s "
        f"({guess.flops / 1e9:8.1f} GFLOP at {guess.flops_per_second / 1e9:6.1f} GFLOP/s)  "
        f"measured {took:7.2f} s  measured/estimate {took / guess.seconds:5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=46)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    run = (args.tokens, args.steps, args.seeds)
    default = rm.load_model("checkpoints/default")
    measure(default, "default checkpoint", *run)
    for name, fields in SHAPES.items():
        torch.manual_seed(0)
        model = rm.RecurrentLM(RecurrentConfig(name=name, block_size=512, **fields)).eval()
        for dtype in (torch.float32, torch.bfloat16):
            measure(model.to(dtype), name, *run)
        del model


if __name__ == "__main__":
    main()
