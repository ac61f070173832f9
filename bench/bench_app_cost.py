"""How close the app's estimates come to the real time of every heavy action.

For each heavy action of the app (collection, lenses, generation, patching, ablation, steering,
stability, diffusion sampling, the training series, UMAP) it prints the estimate the app shows
before the action has ever run on this model (the F.linear speed it uses, no calibration), the
measured time of the same cached computation the app calls, and their ratio. The actions run
through the app's own functions (apps.compute, apps.intervention_compute, apps.stability_compute)
with the app's thread settings, one after the other, so the machine's load is the same for both.

By default on the shipped checkpoint (checkpoints/default). ``--huginn`` does the same at the
Huginn-0125 shape in bfloat16: a random checkpoint written to a temporary directory, loaded the
way the app loads it, and deleted after (about 7 GiB on disk and in memory; long on a small CPU).

Usage: python bench/bench_app_cost.py [--huginn] [--steps N] [--seeds N] [--skip umap,series]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")  # the app's functions run bare here

import streamlit.logger  # noqa: E402
import torch  # noqa: E402

import recurrent_model as rm  # noqa: E402
from apps import (  # noqa: E402
    compute,
    cost,
    inputs,
    intervention_compute,
    stability_compute,
    tab_lenses,
    tab_training,
    tab_wavefront,
)
from apps.cached import with_key  # noqa: E402
from apps.ui import Context  # noqa: E402
from recurrent_model.speed import format_gflops  # noqa: E402
from recurrent_model.standin import byte_level_tokenizer  # noqa: E402
from workbench.checkpoint_series import checkpoint_dirs  # noqa: E402
from workbench.patching import patching_pair  # noqa: E402

SERIES = ROOT / "checkpoints" / "default" / "series"


class Bench:
    """One model's actions: each estimated, then run, then printed as a row."""

    def __init__(self, model, key: str, run: inputs.RunSettings, label: str) -> None:
        self.model, self.key, self.run, self.label = with_key(model, key), key, run, label
        self.rows: list[tuple[str, str, float, float, str]] = []

    def time(self, what: str, guess: cost.CostEstimate | float, call: Callable[[], object]):
        """Run ``call`` and record it against ``guess`` (an estimate, or bare seconds)."""
        start = time.perf_counter()
        out = call()
        took = time.perf_counter() - start
        seconds = guess.seconds if isinstance(guess, cost.CostEstimate) else guess
        speed = (
            format_gflops(guess.flops_per_second) if isinstance(guess, cost.CostEstimate) else "—"
        )
        self.rows.append((what, speed, seconds, took, ""))
        print(f"{what:34s} estimate {seconds:8.2f} s at {speed:14s} actual {took:8.2f} s "
              f"ratio {took / max(seconds, 1e-9):5.2f}", flush=True)  # fmt: skip
        return out

    def context(self, traj) -> Context:
        return Context(model=self.model, model_key=self.key, traj=traj, run=self.run)


def fresh(model) -> None:
    """Forget every cached result and calibration, as in a new app session on this model."""
    import streamlit as st

    st.cache_data.clear()
    cost.CALIBRATION._ratios.pop(model, None)


def collection(b: Bench):
    tokens, runs = len(b.run.token_ids), len(b.run.seeds)
    guess = compute.estimate(b.model, tokens, b.run.num_steps, runs)
    what = f"collection ({runs} seeds × {b.run.num_steps} steps)"
    return b.time(what, guess, lambda: compute.trajectory(b.model, b.run))


def lenses(b: Bench, traj) -> None:
    ctx = b.context(traj)
    for kind in cost.LENS_KINDS:
        guess = tab_lenses.lens_estimate(ctx, kind)
        b.time(
            f"{kind} lens",
            guess,
            lambda k=kind: compute.lens(b.model, traj, ctx.tokens, k),
        )


def generation(b: Bench, new: int) -> None:
    steps, ids = b.run.num_steps, b.run.token_ids
    guess = compute.generation_estimate(b.model, len(ids), new, steps)
    b.time(f"generation ({new} tokens)", guess, lambda: compute.generation(
        b.model, ids, new, steps, None, None, 0.0))  # fmt: skip


def patching(b: Bench) -> None:
    pair, steps = patching_pair(b.model), b.run.num_steps
    patches = intervention_compute.patches_to_run(pair.clean_ids, pair.corrupted_ids, steps, "each")
    guess, batch = intervention_compute.patching_plan(b.model, len(pair.clean_ids), steps, patches)
    b.time(f"patching ({patches} patches)", guess, lambda: intervention_compute.patching(
        b.model, pair.clean_ids, pair.corrupted_ids, steps, "core.hook_state", "each",
        "denoising", 0.0, 0, "logit_diff", pair.target, pair.corrupted_target, batch_size=batch,
    ))  # fmt: skip


def ablation(b: Bench, n_random: int) -> None:
    ids, steps = b.run.token_ids, b.run.num_steps
    guess, batch = intervention_compute.ablation_plan(b.model, len(ids), steps, n_random)
    position = len(ids) - 1
    b.time(f"ablation ({n_random} random planes)", guess, lambda: intervention_compute.ablation(
        b.model, ids, steps, position, n_random, batch_size=batch))  # fmt: skip


def steering(b: Bench, traj, amount: float) -> None:
    ids, steps = b.run.token_ids, b.run.num_steps
    guess = intervention_compute.steering_estimate(b.model, len(ids), steps, "add", amount)
    vector = traj.states[0][-1, -1]
    what = f"steering (add, α = {amount:g}{', sweep' if amount else ''})"
    b.time(what, guess, lambda: intervention_compute.steering(
        b.model, ids, steps, vector, None, "add", amount, (1, steps)))  # fmt: skip


def stability(b: Bench, traj, k: int, position: int) -> None:
    guess = stability_compute.estimate(b.model, position + 1, traj.num_steps, k)
    b.time(f"stability (k = {k}, token {position})", guess, lambda: stability_compute.token_stability(
        b.model, traj, b.run, position, k, stability_compute.stability_progress(position, guess),
    ))  # fmt: skip


def diffusion(b: Bench, traj, new: int) -> None:
    ctx, steps = b.context(traj), b.run.num_steps
    guess = tab_wavefront.wavefront_estimate(ctx, new, 4, 1)
    out = b.time(f"diffusion sampling ({new} tokens)", guess, lambda: compute.diffusion_run(
        b.model, b.run.token_ids, new, steps, 4, 1, 0.03, "latent-diff", 0.0))  # fmt: skip
    passes = cost.diffusion_passes(new, steps, 4, 1)
    print(f"    sampler steps {out['summary']['diffusion_steps']}, estimated {passes}")


def series(b: Bench, traj) -> None:
    found = checkpoint_dirs(SERIES)
    guess, _ = tab_training.series_estimate(b.context(traj), found)
    text = b.model.tokenizer.decode(list(b.run.token_ids), skip_special_tokens=True)
    b.time(f"training series ({len(found)} checkpoints)", guess, lambda: compute.checkpoint_series(
        compute.CheckpointRun(SERIES), text, b.run.num_steps, b.run.seeds))  # fmt: skip


def umap(b: Bench, traj) -> None:
    states = (traj.num_steps + 1) * traj.n_tokens
    seconds, includes = cost.umap_seconds(states)
    first = "first fit" if "import" in includes else "umap loaded"
    b.time(f"UMAP ({states} states, {first})", seconds,
           lambda: compute.umap(traj))  # fmt: skip


def run_all(b: Bench, skip: set[str], shipped: bool) -> None:
    """Every action once, each estimated before anything of its kind ran on this model."""
    fresh(b.model)
    traj = collection(b)
    steps = [
        ("lenses", lambda: lenses(b, traj)),
        ("generation", lambda: generation(b, 16 if shipped else 4)),
        ("patching", lambda: patching(b)),
        ("ablation", lambda: ablation(b, 8 if shipped else 2)),
        ("steering", lambda: steering(b, traj, 4.0 if shipped else 0.0)),
        (
            "stability",
            lambda: stability(b, traj, *((8, len(b.run.token_ids) - 1) if shipped else (2, 3))),
        ),
        ("diffusion", lambda: diffusion(b, traj, 16 if shipped else 4)),
        ("series", lambda: series(b, traj) if shipped else None),
        ("umap", lambda: umap(b, traj)),
    ]
    for name, step in steps:
        if name not in skip:
            step()


def markdown(b: Bench) -> str:
    """The rows as a markdown table (for docs/app.md)."""
    lines = [f"{b.label}", "", "| action | estimate | speed used | actual | actual / estimate |",
             "|---|---|---|---|---|"]  # fmt: skip
    for what, speed, est, took, _ in b.rows:
        lines.append(
            f"| {what} | {est:.1f} s | {speed} | {took:.1f} s | {took / max(est, 1e-9):.2f} |"
        )
    return "\n".join(lines)


def huginn_checkpoint(directory: Path) -> None:
    """A random bfloat16 model of the Huginn-0125 shape with a byte-level tokenizer, saved."""
    config = rm.preset("huginn-0125", name="huginn-0125-random", torch_dtype="bfloat16")
    with torch.device("meta"):
        model = rm.RecurrentLM(config, init_weights=False)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.lm_head.weight = model.transformer.wte.weight
    model.reset_parameters(torch.Generator().manual_seed(0))
    model.tokenizer = byte_level_tokenizer(config.vocab_size)
    model.save_pretrained(directory, max_shard_bytes=2 * 2**30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--huginn", action="store_true", help="the Huginn-0125 shape in bf16")
    parser.add_argument("--steps", type=int, default=None, help="default: 32, or 8 with --huginn")
    parser.add_argument("--seeds", type=int, default=None, help="default: 5, or 1 with --huginn")
    parser.add_argument("--skip", default="", help="comma-separated actions to leave out")
    args = parser.parse_args()
    streamlit.logger.set_log_level("error")  # every streamlit logger, those made later too
    warnings.filterwarnings("ignore")
    skip = set(filter(None, args.skip.split(",")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temporary checkpoint goes
    if args.huginn:
        with tempfile.TemporaryDirectory(prefix="huginn-random-") as tmp:
            start = time.perf_counter()
            huginn_checkpoint(Path(tmp))
            print(
                f"random Huginn-0125-shape checkpoint written in {time.perf_counter() - start:.0f} s"
            )
            model = compute.load(tmp, "cpu", None, compute.checkpoint_signature(Path(tmp)))
            bench_model(model, tmp, args.steps or 8, args.seeds or 1, skip | {"series"}, False)
        return
    model = compute.load(str(ROOT / "checkpoints/default"), "cpu", None, "bench")
    bench_model(model, "checkpoints/default", args.steps or 32, args.seeds or 5, skip, True)


def bench_model(model, key: str, steps: int, seeds: int, skip: set[str], shipped: bool) -> None:
    ids = inputs.encode_input(
        model.tokenizer, model.config.block_size, inputs.DEFAULT_PROMPT, "", False
    )
    run = inputs.RunSettings(tuple(ids), steps, tuple(range(seeds)), 1.0)
    label = (
        f"{model.name}: {model.num_parameters() / 1e6:,.1f} M parameters, {model.dtype}, "
        f"{len(ids)} tokens, {steps} steps, {seeds} seed(s), {torch.get_num_threads()} threads, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(label, flush=True)
    b = Bench(model, key, run, label)
    run_all(b, skip, shipped)
    print()
    print(markdown(b))


if __name__ == "__main__":
    main()
