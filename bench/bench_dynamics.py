"""Dynamics classifier on the synthetic benchmark: accuracy, period error and time per token.

Prints the confusion matrix (true kind × predicted kind), accuracy per kind, per subtype and per
noise level, the relative period error of recovered orbits, and the classification time per token
at the benchmark sizes and at the published width h = 5280, next to the time of a plain per-token
numpy SVD of the same tails (the ratio is what transfers across machines).

Usage: python bench/bench_dynamics.py [--seed 0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from workbench.dynamics import classify_dynamics, default_tail
from workbench.synthetic import make_benchmark, make_set


def run_benchmark(seed: int, repeats: int) -> tuple[pd.DataFrame, list[dict]]:
    """Labels + predictions of every benchmark token, and timings per (steps, h) group."""
    frames, timings = [], []
    for s in make_benchmark(seed=seed, repeats=repeats):
        t0 = time.perf_counter()
        pred = classify_dynamics(s.states).reset_index(drop=True)
        elapsed = time.perf_counter() - t0
        steps, n_tokens, h = s.states.shape[0] - 1, s.states.shape[1], s.states.shape[2]
        timings.append(dict(steps=steps, h=h, tokens=n_tokens, seconds=elapsed))
        frames.append(pd.concat([s.labels, pred[["kind", "period"]].add_suffix("_pred")], axis=1))
    return pd.concat(frames, ignore_index=True), timings


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
    for col in ("kind", "subtype", "noise", "steps"):
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    r, timings = run_benchmark(args.seed, args.repeats)
    report_accuracy(r)
    report_periods(r)
    report_timing([(t["steps"], t["h"]) for t in timings], args.seed)


if __name__ == "__main__":
    main()
