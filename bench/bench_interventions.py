"""Activation patching speed, measured side by side in one process on checkpoints/default.

A position × step grid of core-state patches (64 tokens × steps 0 … 32 = 2112 cells) computed by
`workbench.patch_states` as shipped (batched forwards, each patch of s_i resuming from the cached s_i)
against the naive way (one full forward per patch, patching through the hook, batch_size=1,
reuse_prefix=False). The naive way costs minutes per grid, so it runs on a sample of cells
(positions × steps, the same cells also run batched without the resume, to split the two gains); its
per-cell time is scaled to the grid. The shipped result is checked against the naive one on the
sampled cells.

Usage: python bench/bench_interventions.py [--threads 2] [--tokens 64] [--steps 32]
       [--sample-positions 8 --sample-steps 6] [--checkpoint checkpoints/default]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import recurrent_model as rm
import workbench as wb

ROOT = Path(__file__).resolve().parents[1]
TEXT = (
    "Claire makes a 3 egg omelet every morning for breakfast. How many dozens of eggs will she "
    "eat in 4 weeks? She eats 3 eggs a day and there are 7 days in a week, so in 4 weeks she "
    "eats 3 * 7 * 4 = 84 eggs, which is 84 / 12 = 7 dozen eggs. The answer is 7. "
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"
)


def prompt_pair(model: rm.RecurrentLM, tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A clean prompt of ``tokens`` tokens and a corrupted copy with the first " 3" made " 5"."""
    ids = model.tokenizer.encode(TEXT)
    while len(ids) < tokens:
        ids = ids + ids
    clean = torch.tensor(ids[:tokens])
    three, five = model.tokenizer.encode(" 3", False), model.tokenizer.encode(" 5", False)
    corrupted = clean.clone()
    where = (clean == three[-1]).nonzero()
    pos = int(where[0]) if len(where) else tokens // 4
    corrupted[pos] = five[-1] if corrupted[pos] != five[-1] else three[-1]
    return clean, corrupted, pos


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--sample-positions", type=int, default=8)
    ap.add_argument("--sample-steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "default"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = rm.load_model(args.checkpoint)
    clean, corrupted, corrupted_at = prompt_pair(model, args.tokens)
    rng = np.random.default_rng(0)
    positions = sorted(rng.choice(args.tokens, args.sample_positions, replace=False).tolist())
    steps = sorted(rng.choice(args.steps + 1, args.sample_steps, replace=False).tolist())
    n_sample = len(positions) * len(steps)
    n_grid = args.tokens * (args.steps + 1)
    common = dict(num_steps=args.steps)
    with torch.no_grad():  # warm-up: first-call allocations stay out of the timings
        model(clean[None].expand(args.batch_size, -1), num_steps=2, init_scale=0.0)

    t_naive, naive = timed(
        lambda: wb.patch_states(
            model, clean, corrupted, positions=positions, steps=steps, batch_size=1,
            reuse_prefix=False, **common,
        )
    )  # fmt: skip
    t_batched, batched = timed(
        lambda: wb.patch_states(
            model, clean, corrupted, positions=positions, steps=steps, batch_size=n_sample,
            reuse_prefix=False, **common,
        )
    )  # fmt: skip
    t_grid, grid = timed(
        lambda: wb.patch_states(
            model, clean, corrupted, batch_size=args.batch_size, progress=True, **common
        )
    )
    on_sample = grid.set_index(["position", "step"]).loc[
        list(zip(naive.position, naive.step)), "restored"
    ]
    naive_grid_s = t_naive / n_sample * n_grid
    results = {
        "checkpoint": args.checkpoint,
        "threads": args.threads,
        "grid": f"{args.tokens} tokens x {args.steps + 1} steps = {n_grid} cells",
        "corrupted_position": corrupted_at,
        "naive_one_at_a_time_s_per_cell": t_naive / n_sample,
        "batched_no_resume_s_per_cell": t_batched / n_sample,
        "shipped_grid_s": t_grid,
        "shipped_s_per_cell": t_grid / n_grid,
        "naive_grid_s_scaled": naive_grid_s,
        "speedup_batching_alone": t_naive / t_batched,
        "speedup_shipped_vs_naive": naive_grid_s / t_grid,
        "max_abs_diff_restored_vs_naive": float(np.max(np.abs(on_sample - naive.restored.values))),
        "restored_final_state_all_positions_check": float(
            wb.patch_states(
                model, clean, corrupted, positions="all", steps=[args.steps], **common
            ).restored.iloc[0]
        ),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
