"""What the stability analyses cost, as ratios from one run (timings are noisy on a shared CPU).

1. k = 8 Lyapunov exponents over 64 steps for one token, as a multiple of one forward at the same
   depth (64 core iterations over the same prompt); the goal is <= 3·k. Every token's λ_1 over 64
   steps as one JVP per step (own-row attention) against one batched JVP of a tangent per token.
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
   iterations, relative (scale-free) and absolute, mean and range per sub-layer; the whole-sequence
   fixed point's core passes from s_0 = 0 (Anderson and plain iteration, to ``--tol`` within
   ``--cap`` passes) in float32 and in float64, per prompt, with median and range; per checkpoint of
   checkpoints/default/series every token's λ_1 and the orbiting tokens; ``explain_dynamics`` on the
   early checkpoints' orbiting prompts. Every number is also written to ``--out`` (JSON), which
   tests/test_claims.py compares with the doc's sentences.

    .venv/bin/python bench/bench_stability.py [--checkpoint checkpoints/default] [--skip-big]
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_stability.py --findings
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_stability.py --iterations   # only the counts
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import recurrent_model as rm
import workbench
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
SERIES = ROOT / "checkpoints" / "default" / "series"
SERIES_STEPS = (300, 1200, 2400, 3600)
#: (series step, index into PROMPTS) of the orbiting prompts docs/stability.md explains.
FLIP_CASES = ((300, 1), (1200, 0), (1200, 2), (1200, 3))
#: Where ``--findings`` writes its numbers (committed; tests/test_claims.py reads it).
FINDINGS = ROOT / "eval" / "results" / "stability_findings.json"


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


def token_table_cost(model: rm.RecurrentLM, repeats: int) -> None:
    """Every token's λ_1 over STEPS steps on the first prompt: one JVP per step (own-row attention,
    the map's path) against one batched JVP of T single-row tangents, alternating, best of each."""
    ids = model.tokenizer.encode(PROMPTS[0])
    core = CoreMap.from_model(model, ids)
    start = initial_state(model, core, 1.0, 0)
    per_token = copy.copy(core)
    per_token.causal_rows = False  # this copy takes the batched per-token JVPs
    found, seconds = {}, {"one pass": [], "per token": []}
    for _ in range(repeats):
        for name, map_ in (("one pass", core), ("per token", per_token)):
            t0 = time.perf_counter()
            found[name] = token_stretches(map_, start, STEPS)
            seconds[name].append(time.perf_counter() - t0)
    one, each = min(seconds["one pass"]), min(seconds["per token"])
    gap = np.abs(found["one pass"][STEPS // 2 :].mean(0) - found["per token"][STEPS // 2 :].mean(0))
    print(f"[1] every token's λ_1, {len(ids)} tokens over {STEPS} steps: one JVP per step {one:.2f} s, "
          f"one batched JVP of {len(ids)} tangents per step {each:.2f} s ({each / one:.1f}x); "
          f"largest λ_1 difference {gap.max():.1e}")  # fmt: skip


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


def spread(values: Sequence[float]) -> dict[str, float]:
    """median, min and max of ``values`` (the spread over prompts or tokens)."""
    arr = np.asarray(values, dtype=float)
    return {"median": float(np.median(arr)), "min": float(arr.min()), "max": float(arr.max())}


def exponent_findings(model: rm.RecurrentLM, steps: int = 48) -> dict[str, float]:
    """λ_1 of every token at ``steps`` and 2·``steps`` with errors; the docstring source token."""
    found = {steps: [], 2 * steps: []}
    for text in PROMPTS:
        stretches = prompt_stretches(model, text, 2 * steps)
        for n in found:
            found[n].append(estimate(stretches[:n], n // 2))
    out: dict[str, float] = {}
    for n, parts in found.items():
        lam = np.concatenate([m for m, _ in parts])
        err = np.concatenate([e for _, e in parts])
        top = int(lam.argmax())
        print(f"[4] default prompts, {len(lam)} tokens, {n} steps (last {n - n // 2}): λ_1 from "
              f"{lam.min():.3f} to {lam[top]:.3f} ± {err[top]:.3f}, median {np.median(lam):.3f}; "
              f"negative {int((lam < 0).sum())}, neutral {int(is_neutral(lam, err).sum())}")  # fmt: skip
        out |= {"default.tokens": len(lam), f"default.{n}.min": lam.min(),
                f"default.{n}.max": lam[top], f"default.{n}.max_stderr": err[top],
                f"default.{n}.median": np.median(lam), f"default.{n}.negative": (lam < 0).sum(),
                f"default.{n}.neutral": is_neutral(lam, err).sum()}  # fmt: skip
    stretches = prompt_stretches(model, DOCSTRING, 256)
    for n in (48, 96, 128, 256):
        lam, err = estimate(stretches[:n], n // 2)
        top = int(lam.argmax())
        print(f"[4] docstring prompt, {n} steps: largest λ_1 token {top}: {lam[top]:+.4f} ± "
              f"{err[top]:.4f} (neutral {bool(is_neutral(lam[top], err[top]))}); neutral tokens "
              f"{int(is_neutral(lam, err).sum())} of {len(lam)}")  # fmt: skip
        out |= {"docstring.tokens": len(lam), f"docstring.{n}.source": top,
                f"docstring.{n}.lambda_1": lam[top], f"docstring.{n}.stderr": err[top],
                f"docstring.{n}.neutral": is_neutral(lam[top], err[top])}  # fmt: skip
    return {key: float(value) for key, value in out.items()}


def attribution_findings(
    model: rm.RecurrentLM, per_prompt: int = 4, steps: int = 16
) -> dict[str, float]:
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
    out = {"attribution.tokens": float(len(frames))}
    for column in ("relative", "log_stretch", "log_scale"):
        stats = table.groupby("sublayer", sort=False)[column].agg(["mean", "min", "max"])
        parts = [f"{name} {r['mean']:+.2f} ({r['min']:+.2f} … {r['max']:+.2f})"
                 for name, r in stats.iterrows()]  # fmt: skip
        print(f"[4]   {column}: " + ", ".join(parts))
        for name, r in stats.iterrows():
            out |= {f"attribution.{column}.{name}.{k}": float(r[k]) for k in ("mean", "min", "max")}
    totals = [(f.attrs["total_relative"], f.attrs["total"]) for f in frames]
    rel, ab = np.array(totals).T
    print(f"[4]   totals: relative {rel.mean():+.3f}, absolute {ab.mean():+.3f}")
    scale = float(np.exp(out["attribution.log_scale.adapter.mean"]))  # ‖adapter output‖ / ‖s‖
    return out | {
        "attribution.total_relative": float(rel.mean()),
        "attribution.total": float(ab.mean()),
        "attribution.adapter_scale": scale,
    }


def iteration_counts(model: rm.RecurrentLM, tol: float, cap: int) -> dict[str, float]:
    """Core passes to the whole-sequence fixed point from s_0 = 0 per prompt, Anderson and plain
    iteration, in float32 and float64 (a float64 copy of the model): median and range over the
    prompts. A count that reaches ``cap`` unconverged is recorded as NaN and counted separately."""
    out: dict[str, float] = {"iterations.tol": tol, "iterations.cap": float(cap),
                             "iterations.prompts": float(len(PROMPTS))}  # fmt: skip
    for dtype in (torch.float32, torch.float64):
        copy_ = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        name, counts = str(dtype).removeprefix("torch."), {"anderson": [], "plain": []}
        for i, text in enumerate(PROMPTS):
            core = CoreMap.from_model(copy_, copy_.tokenizer.encode(text))
            start = torch.zeros(core.shape, dtype=dtype)
            solved = anderson(core, start, tol, cap)
            plain = plain_passes(core, start, tol, cap)
            counts["anderson"].append(solved.passes if solved.converged else np.nan)
            counts["plain"].append(np.nan if plain is None else plain)
            for method, values in counts.items():
                out[f"iterations.{name}.{method}.prompt{i}"] = float(values[-1])
            print(f"[5] {name}, prompt {i} ({core.shape[0]} tokens), to {tol:g} within {cap} passes: "
                  f"Anderson {counts['anderson'][-1]:.0f}, plain {counts['plain'][-1]:.0f}")  # fmt: skip
        for method, values in counts.items():
            arr = np.asarray(values, dtype=float)
            reached = arr[np.isfinite(arr)]
            stats = (
                spread(reached) if len(reached) else dict.fromkeys(("median", "min", "max"), np.nan)
            )
            out |= {f"iterations.{name}.{method}.{k}": v for k, v in stats.items()}
            out[f"iterations.{name}.{method}.capped"] = float(len(arr) - len(reached))
            print(f"[5] {name} {method}: median {stats['median']:.0f} (min {stats['min']:.0f}, max "
                  f"{stats['max']:.0f}) over the prompts that converged; "
                  f"{len(arr) - len(reached)} not within {cap}")  # fmt: skip
    return out


def kind_findings(model: rm.RecurrentLM, steps: int = 128) -> dict[str, float]:
    """How many tokens of the default prompts the classifier calls fixed points at ``steps``
    iterations from the seed-0 random s_0 (init_scale 1), as the app does."""
    kinds = []
    for text in PROMPTS:
        ids = model.tokenizer.encode(text)
        traj = workbench.collect(model, ids, steps, seeds=(0,), init_scale=1.0, progress=False)
        kinds += list(workbench.classify_dynamics(traj.states[0])["kind"])
    fixed = sum(kind == "fixed_point" for kind in kinds)
    print(f"[4] default prompts at {steps} iterations: {fixed} of {len(kinds)} tokens fixed points")
    return {
        "kinds.steps": float(steps),
        "kinds.tokens": float(len(kinds)),
        "kinds.fixed": float(fixed),
    }


def spectrum_findings(model: rm.RecurrentLM, per_prompt: int = 4) -> dict[str, float]:
    """Leading eigenvalues (k = 4, Arnoldi) at the fixed points of the attribution's tokens: the
    spectral radius range, and how many lead with a complex pair (their modulus range)."""
    radius, complex_modulus = [], []
    for text in PROMPTS:
        ids = model.tokenizer.encode(text)
        for position in np.linspace(1, len(ids) - 1, per_prompt).round().astype(int):
            eig = workbench.fixed_point_spectrum(model, ids, position=int(position), k=4,
                                                 num_steps=128, init_scale=1.0)  # fmt: skip
            radius.append(float(eig["modulus"].iloc[0]))
            if abs(float(eig["imag"].iloc[0])) > 1e-6:
                complex_modulus.append(radius[-1])
    print(f"[4] spectra at {len(radius)} fixed points: radius {min(radius):.3f} … "
          f"{max(radius):.3f}; {len(complex_modulus)} lead with a complex pair (modulus "
          f"{min(complex_modulus, default=np.nan):.2f} … {max(complex_modulus, default=np.nan):.2f})")  # fmt: skip
    return {"spectra.tokens": float(len(radius)), "spectra.radius_min": min(radius),
            "spectra.radius_max": max(radius), "spectra.complex": float(len(complex_modulus)),
            "spectra.complex_min": min(complex_modulus, default=np.nan),
            "spectra.complex_max": max(complex_modulus, default=np.nan)}  # fmt: skip


def load_series(step: int) -> rm.RecurrentLM:
    """A checkpoint of the shipped run's series, stored in bfloat16, analysed in float32."""
    return rm.load_model(SERIES / f"step-{step:07d}").float().eval()


def series_findings(
    shipped: rm.RecurrentLM, steps: int = 48, classify: int = 128
) -> dict[str, float]:
    """Per series checkpoint over the default prompts: every token's λ_1 at ``steps`` (mean, largest,
    negative count) and the tokens the classifier calls orbits at ``classify`` iterations. The last
    step is the shipped model itself (float32), the others the series' bfloat16 copies."""
    out: dict[str, float] = {}
    for step in SERIES_STEPS:
        model = shipped if step == SERIES_STEPS[-1] else load_series(step)
        lam, orbit = [], []
        for text in PROMPTS:
            lam.append(estimate(prompt_stretches(model, text, steps), steps // 2)[0])
            traj = workbench.collect(model, model.tokenizer.encode(text), classify, seeds=(0,),
                                     init_scale=1.0, progress=False)  # fmt: skip
            orbit.append(workbench.classify_dynamics(traj.states[0])["kind"].to_numpy() == "orbit")
        lam, orbit = np.concatenate(lam), np.concatenate(orbit)
        on_orbit = lam[orbit] if orbit.any() else np.array([np.nan])
        print(f"[6] step {step}: {len(lam)} tokens, λ_1 mean {lam.mean():.3f}, largest "
              f"{lam.max():.3f}, negative {int((lam < 0).sum())}; orbit tokens {int(orbit.sum())}, "
              f"their λ_1 {on_orbit.min():.3f} … {on_orbit.max():.3f}")  # fmt: skip
        out |= {f"series.{step}.mean": float(lam.mean()), f"series.{step}.max": float(lam.max()),
                f"series.{step}.negative": float((lam < 0).sum()),
                f"series.{step}.orbits": float(orbit.sum()),
                f"series.{step}.orbit_min": float(on_orbit.min()),
                f"series.{step}.orbit_max": float(on_orbit.max())}  # fmt: skip
    return out


def explain_source(model: rm.RecurrentLM, ids: list[int], key: str) -> dict[str, float]:
    """``explain_dynamics`` (128 iterations, k = 4): the first orbiting token's fixed point and
    eigenvalue, the orbits' period, and the blocks of the orbiting tokens after it."""
    frame = workbench.explain_dynamics(model, ids, 128, k=4)
    orbits = frame[frame["kind"] == "orbit"]
    source, after = orbits.iloc[0], orbits.iloc[1:]
    out = {"orbits": len(orbits), "source": source["position"],
           "period": orbits["measured_period"].median(), "stable": source["stable"],
           "passes": source["fixed_point_passes"], "residual": source["residual"],
           "real": source["eig_real"], "imag": abs(source["eig_imag"]),
           "modulus": source["eig_modulus"], "predicted_period": source["predicted_period"],
           "measured_period": source["measured_period"],
           "distance_pct": 100 * source["distance_from_final"],
           "driven": (after["mechanism"] == "driven").sum(),
           "after_radius_min": after["spectral_radius"].min(),
           "after_radius_max": after["spectral_radius"].max()}  # fmt: skip
    print(f"[6] {key}: " + ", ".join(f"{k} {float(v):.4g}" for k, v in out.items()))
    return {f"{key}.{k}": float(v) for k, v in out.items()}


def flip_findings(model: rm.RecurrentLM) -> dict[str, float]:
    """The orbiting prompts of the early checkpoints, and the docstring prompt's first 7 tokens on
    the shipped model (causal attention: they move as in the whole prompt)."""
    out = explain_source(model, model.tokenizer.encode(DOCSTRING)[:7], "rotation.docstring")
    for step, prompt in FLIP_CASES:
        series = load_series(step)
        out |= explain_source(
            series, series.tokenizer.encode(PROMPTS[prompt]), f"flip.{step}.{prompt}"
        )
    return out


def findings(model: rm.RecurrentLM, out: Path, tol: float, cap: int) -> None:
    """Every number docs/stability.md quotes, printed and written to ``out`` as JSON."""
    values = iteration_counts(model, tol, cap)
    values |= attribution_findings(model)
    values |= kind_findings(model)
    values |= exponent_findings(model)
    values |= spectrum_findings(model)
    values |= series_findings(model)
    values |= flip_findings(model)
    record = {
        "script": "bench/bench_stability.py --findings",
        "checkpoint": model.name,
        "threads": torch.get_num_threads(),
        "values": values,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True, allow_nan=True) + "\n")
    print(f"wrote {len(values)} numbers to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "default"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-iter", type=int, default=500)
    parser.add_argument("--big-passes", type=int, default=40)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--only-big", action="store_true")
    parser.add_argument("--findings", action="store_true", help="the numbers of docs/stability.md")
    parser.add_argument("--out", type=Path, default=FINDINGS, help="--findings: the JSON record")
    parser.add_argument("--tol", type=float, default=TOL, help="--findings: fixed-point tolerance")
    parser.add_argument(
        "--cap", type=int, default=5000, help="--findings: passes per solve, at most"
    )
    parser.add_argument(
        "--iterations", action="store_true", help="only the float32/float64 counts; writes nothing"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = rm.load_model(args.checkpoint).eval()
    print(
        f"{model.name}: {model.config.shape_summary()} (one thread; shared CPU, timings are noisy)"
    )
    if args.only_big:
        big_shape(args.big_passes)
        return
    if args.iterations:
        iteration_counts(model, args.tol, args.cap)
        return
    if args.findings:
        findings(model, args.out, args.tol, args.cap)
        return
    lyapunov_cost(model, args.repeats)
    token_table_cost(model, args.repeats)
    for tol in (
        TOL,
        1e-4,
    ):  # 1e-4: above the float32 floor plain iteration stalls at on slow tokens
        anderson_vs_plain(model, args.max_iter, tol)
    if not args.skip_big:
        big_shape(args.big_passes)


if __name__ == "__main__":
    main()
