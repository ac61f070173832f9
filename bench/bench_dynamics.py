"""Dynamics classifier on the synthetic benchmark: accuracy, period error and time per token.

Prints the confusion matrix (true kind × predicted kind), accuracy per kind, per subtype and per
noise level, the relative period error of recovered orbits, and the classification time per token
at the benchmark sizes and at the published width h = 5280, next to the time of a plain per-token
numpy SVD of the same tails (the ratio is what transfers across machines).

Seed 0 is the benchmark the tests use. The classifier's rules and thresholds were chosen looking at
seeds 0–4; seeds 5 and up are fresh draws of the same generator (held out), e.g. --seeds 5,6,7,8,9.
The orbits include long periods (55–75 % of the run) and period-2 flips. `--holdout` seeds run the
independent family of `workbench.synthetic_holdout` (a different construction, never tuned on;
seed 1000 was inspected once while developing, 2000 and up were not).

Usage: python bench/bench_dynamics.py [--seeds 0,1,2] [--repeats 3] [--holdout 2000,2001]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from workbench.dynamics import classify_dynamics, default_tail
from workbench.synthetic import make_benchmark, make_set
from workbench.synthetic_holdout import make_holdout


def run_benchmark(seeds: list[int], repeats: int, holdout: bool = False) -> pd.DataFrame:
    """Labels + predictions of every benchmark (or held-out family) token of every seed."""
    frames = []
    make = make_holdout if holdout else make_benchmark
    for seed in seeds:
        for s in make(seed=seed, repeats=repeats):
            pred = classify_dynamics(s.states).reset_index(drop=True)
            pred = pred[["kind", "period", "flip"]].add_suffix("_pred")
            frames.append(pd.concat([s.labels.assign(seed=seed), pred], axis=1))
    return pd.concat(frames, ignore_index=True)


def svd_seconds(states: np.ndarray) -> float:
    """Time of one numpy SVD per token of its default tail (single BLAS thread)."""
    tail = default_tail(states.shape[0] - 1)
    t0 = time.perf_counter()
    with threadpool_limits(1):
        for i in range(states.shape[1]):
            x = states[-tail - 1 :, i]
            np.linalg.svd(x - x.mean(axis=0), full_matrices=False)
    return time.perf_counter() - t0


def report_accuracy(r: pd.DataFrame) -> None:
    hit = r.kind == r.kind_pred
    print(f"tokens: {len(r)}   kind accuracy: {hit.mean():.4f}")
    print("\nconfusion matrix (rows: true kind, columns: predicted)")
    print(pd.crosstab(r.kind, r.kind_pred).to_string())
    for col in ("kind", "seed", "subtype", "noise", "steps"):
        print(f"\naccuracy per {col}")
        print(
            hit.groupby([r.kind, r[col]] if col != "kind" else r.kind).mean().round(4).to_string()
        )


def report_periods(r: pd.DataFrame) -> None:
    orbits = r[(r.kind == "orbit") & (r.kind_pred == "orbit")]
    err = (orbits.period_pred / orbits.period - 1).abs()
    print(
        f"\nperiod relative error over {len(err)} recovered orbits (true periods "
        f"{orbits.period.min():.1f}-{orbits.period.max():.1f} steps)"
    )
    q = err.quantile([0.5, 0.9, 0.95, 0.99])
    print(
        f"median {q[0.5]:.2e}  q90 {q[0.9]:.2e}  q95 {q[0.95]:.2e}  q99 {q[0.99]:.2e}  "
        f"max {err.max():.2e}"
    )
    print(err.groupby(orbits.subtype).describe()[["50%", "max"]].to_string())
    flips = orbits.subtype.isin(["flip"])
    print(f"flip flag agrees on {(orbits.flip_pred == flips).mean():.4f} of recovered orbits")


def _time_one(states: np.ndarray) -> None:
    steps, tokens, h = states.shape
    t0 = time.perf_counter()
    classify_dynamics(states)
    ours = (time.perf_counter() - t0) / tokens
    svd = svd_seconds(states) / tokens
    print(
        f"steps {steps - 1:4d}  h {h:5d}: {1e3 * ours:7.2f} ms/token = {ours / svd:5.1f} x "
        f"one SVD of the tail ({1e3 * svd:.2f} ms)"
    )


def report_timing(sizes: list[tuple[int, int]], seed: int) -> None:
    """Time per token at the benchmark sizes and at h = 5280 (32 orbit/slider tokens)."""
    print("\ntime per token (default tail = steps // 2)")
    for steps, h in sizes:
        _time_one(make_benchmark(seed=seed, repeats=1, sizes=((steps, h),))[0].states)
    rng = np.random.default_rng(seed)
    _time_one(
        make_set([("orbit", "circle", 0.0), ("slider", "line", 0.0)] * 16, 64, 5280, rng).states
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated generator seeds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--holdout", default="2000", help="held-out family seeds ('' for none)")
    args = parser.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    r = run_benchmark(seeds, args.repeats)
    report_accuracy(r)
    report_periods(r)
    if args.holdout:
        print("\n=== held-out generator family (workbench.synthetic_holdout) ===")
        held = run_benchmark([int(x) for x in args.holdout.split(",")], 2, holdout=True)
        report_accuracy(held)
        report_periods(held)
    sizes = sorted(set(zip(r.steps, r.h)))
    report_timing(sizes, seeds[0])


if __name__ == "__main__":
    main()
