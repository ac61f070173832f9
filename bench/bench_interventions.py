"""Activation patching speed, measured side by side in one process on checkpoints/default.

A position × step grid of core-state patches (64 tokens × steps 0 … 32 = 2112 cells) computed by
`workbench.patch_states` as shipped (batched forwards, each patch of s_i resuming from the cached s_i)
against the naive way (one full forward per patch, the clean state put in by a hook, written out here
as a user of the hooks would). The naive way costs minutes per grid, so it runs on a sample of cells
(positions × steps at or after the corrupted token, the same cells also run batched without the resume,
to split the gains); its per-cell time is scaled to the whole grid, every cell of which it would run
(the shipped code skips patches that change nothing: positions before the corrupted token, s_0). The shipped result is checked against the naive one on the
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
from recurrent_model.hook_names import STATE

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


def naive_patching(
    model: rm.RecurrentLM,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    num_steps: int,
    cells: list[tuple[int, int]],
) -> tuple[float, np.ndarray]:
    """The baseline as one would write it with the hooks: one forward of the corrupted prompt per
    (position, step), the clean state put in by a hook. Returns (seconds for the patched forwards,
    restored per cell); the two reference runs are not timed."""
    with torch.inference_mode():
        out_c, cache = model.run_with_cache(
            clean[None], num_steps=num_steps, names_filter=STATE, init_scale=0.0
        )
        out_x = model(corrupted[None], num_steps=num_steps, init_scale=0.0)
        lp_c = torch.log_softmax(out_c.logits[0, -1], -1)
        lp_x = torch.log_softmax(out_x.logits[0, -1], -1)
        target = int(lp_c.argmax())
        states = cache[STATE]
        patched = []
        t0 = time.perf_counter()
        for pos, step in cells:

            def put(x, hook, pos=pos, step=step):
                if hook.step != step:
                    return None
                x = x.clone()
                x[0, pos] = states[step][0, pos]
                return x

            with model.hooks([(STATE, put)]):
                out = model(corrupted[None], num_steps=num_steps, init_scale=0.0)
            patched.append(float(torch.log_softmax(out.logits[0, -1], -1)[target]))
        seconds = time.perf_counter() - t0
    restored = (np.array(patched) - float(lp_x[target])) / float(lp_c[target] - lp_x[target])
    return seconds, restored


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
    # sampled cells where the patch changes something (at or after the corrupted token, steps ≥ 1):
    # the naive way runs a full forward for every cell of the grid
    later = np.arange(corrupted_at, args.tokens)
    positions = sorted(rng.choice(later, min(args.sample_positions, len(later)), replace=False))
    steps = sorted(rng.choice(np.arange(1, args.steps + 1), args.sample_steps, replace=False))
    positions, steps = [int(p) for p in positions], [int(s) for s in steps]
    n_sample = len(positions) * len(steps)
    n_grid = args.tokens * (args.steps + 1)
    common = dict(num_steps=args.steps)
    with torch.no_grad():  # warm-up: first-call allocations stay out of the timings
        model(clean[None].expand(args.batch_size, -1), num_steps=2, init_scale=0.0)

    cells = [(p, st) for p in positions for st in steps]
    t_naive, naive = naive_patching(model, clean, corrupted, args.steps, cells)
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
    on_sample = grid.set_index(["position", "step"]).loc[cells, "restored"].to_numpy()
    naive_grid_s = t_naive / n_sample * n_grid
    results = {
        "checkpoint": args.checkpoint,
        "threads": args.threads,
        "grid": f"{args.tokens} tokens x {args.steps + 1} steps = {n_grid} cells",
        "corrupted_position": corrupted_at,
        "naive_one_at_a_time_s_per_cell": t_naive / n_sample,
        "batched_no_resume_s_per_cell_incl_2_reference_runs": t_batched / n_sample,
        "shipped_grid_s": t_grid,
        "shipped_s_per_cell": t_grid / n_grid,
        "naive_grid_s_scaled": naive_grid_s,
        "speedup_batching_alone": t_naive / t_batched,
        "speedup_shipped_vs_naive": naive_grid_s / t_grid,
        "max_abs_diff_restored_vs_naive": float(np.max(np.abs(on_sample - naive))),
        "restored_final_state_all_positions_check": float(
            wb.patch_states(
                model, clean, corrupted, positions="all", steps=[args.steps], **common
            ).restored.iloc[0]
        ),
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
