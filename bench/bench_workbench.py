"""Workbench performance, measured side by side in one process.

1. Collect 256 tokens × 64 steps × 5 seeds at h=256 (the "small" preset, random weights): batched
   (all 5 seeds in one forward) vs one seed per forward; then every analysis on the result.
2. PCA (6 components) of 65 steps × 512 tokens at h=5280, float32 (random low-rank data plus noise):
   our exact solver (covariance + Lanczos) vs sklearn's full SVD on the same matrix, with the
   largest coordinate and component differences.
3. UMAP on the states of (1): cold (import + fit) vs warm (the cache) vs refit (imported, no cache).

Usage: python bench/bench_workbench.py [--threads 2] [--only collect|pca|umap]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.decomposition import PCA

import recurrent_model as rm
import workbench as wb
from workbench import projections
from workbench.pca import pca_solver


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_collect(results: dict[str, Any]) -> wb.Trajectory:
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("small")).eval()
    ids = torch.randint(0, model.config.vocab_size, (256,))
    seeds = tuple(range(5))
    args = dict(num_steps=64, seeds=seeds, progress=False)
    t_batched, traj = timed(lambda: wb.collect(model, ids, batch_size=5, **args))
    t_single, single = timed(lambda: wb.collect(model, ids, batch_size=1, **args))
    assert np.array_equal(traj.raw_states, single.raw_states)
    results["collect_batched_s"] = t_batched
    results["collect_one_seed_per_forward_s"] = t_single
    results["collect_batching_speedup"] = t_single / t_batched

    t_norm, z = timed(lambda: traj.normalized_states)
    stages: dict[str, Callable[[], Any]] = {
        "convergence (5 seeds)": lambda: [wb.convergence(z[k]) for k in range(5)],
        "steps_to_converge": lambda: wb.steps_to_converge(wb.convergence(z[0]), 1e-2),
        "path_independence": lambda: wb.path_independence(z),
        "attractor_distance": lambda: wb.attractor_distance(z, window=16),
        "step_dynamics (5 seeds)": lambda: [wb.step_dynamics(z[k]) for k in range(5)],
        "token_correlation (5 seeds)": lambda: [wb.token_correlation(z[k]) for k in range(5)],
        "classify_dynamics (5 seeds)": lambda: [wb.classify_dynamics(z[k]) for k in range(5)],
        "PCA over 5 seeds (6 PCs)": lambda: wb.project(z, n_components=6),
        "coda lens (1 seed)": lambda: wb.lens(model, traj.raw_states[0], "coda"),
        "logit lens (1 seed)": lambda: wb.lens(model, traj.raw_states[0], "logit"),
        "iteration probe (1 seed)": lambda: wb.iteration_probe(z[0]),
    }
    analysis = {"normalised view (ln_f)": t_norm}
    analysis.update({name: timed(fn)[0] for name, fn in stages.items()})
    results["analysis_s"] = analysis
    results["analysis_total_s"] = sum(analysis.values())
    return traj


def bench_pca(results: dict[str, Any], h: int = 5280) -> None:
    rng = np.random.default_rng(0)
    n, rank = 65 * 512, 64
    spectrum = np.geomspace(20, 0.5, rank).astype(np.float32)
    basis = rng.standard_normal((rank, h), dtype=np.float32) / np.float32(np.sqrt(h))
    x = (rng.standard_normal((n, rank), dtype=np.float32) * spectrum) @ basis
    x += np.float32(0.05) * rng.standard_normal((n, h), dtype=np.float32)
    assert x.dtype == np.float32  # as collected states are
    states = x.reshape(65, 512, h)
    k = 6
    t_ours, (coords, ours) = timed(lambda: wb.project(states, n_components=k))
    t_full, full = timed(lambda: PCA(n_components=k, svd_solver="full").fit(x))
    ref = full.transform(x)
    results["pca_solver"] = pca_solver(n, h, k)
    results["pca_ours_s"] = t_ours
    results["pca_sklearn_full_svd_s"] = t_full
    results["pca_speedup_vs_full_svd"] = t_full / t_ours
    diff = np.abs(coords.reshape(-1, k) - ref).max()
    results["pca_max_coord_diff_rel"] = float(diff / np.abs(ref).max())
    results["pca_max_component_diff"] = float(np.abs(ours.components_ - full.components_).max())


def bench_umap(results: dict[str, Any], traj: wb.Trajectory) -> None:
    if "umap" in sys.modules:
        raise RuntimeError("umap was imported before the cold measurement")
    z = traj.states[0]  # 65 steps × 256 tokens
    t_cold, _ = timed(lambda: wb.project(z, method="umap"))
    t_warm, _ = timed(lambda: wb.project(z, method="umap"))
    projections.umap_cache_clear()
    t_refit, _ = timed(lambda: wb.project(z, method="umap"))
    results["umap_cold_s"] = t_cold
    results["umap_warm_s"] = t_warm
    results["umap_refit_s"] = t_refit
    results["umap_cold_over_warm"] = t_cold / t_warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("collect", "pca", "umap"), default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"threads": args.threads}
    if args.only in (None, "pca"):
        bench_pca(results)
        print(json.dumps(results, indent=2), flush=True)
    if args.only in (None, "collect", "umap"):
        traj = bench_collect(results)
        print(json.dumps(results, indent=2), flush=True)
    if args.only in (None, "umap"):
        bench_umap(results, traj)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
