"""Corpus engine throughput, from one run on this machine (docs/performance.md, docs/corpus.md).

Prints, on the shipped checkpoint and the held-out sets:
- tokens analysed per second (token × seed runs) for dynamics + lens, as a fraction of a plain
  batched forward at the same depth and batches (goal: ≥ 80 %), with the host part on its
  background thread (the engine's way) and in series; the seeds and stability analyses separately;
- where the engine's time goes (``engine_split``): the device part of each batch (forward, lens,
  copy) and its host part (classification, rows);
- the plain forward against the matmul floor: the cost model's FLOPs at the F.linear speed this
  machine measures at the model's shapes;
- one process against 2 gloo ranks (the CLI end to end, both measured here);
- an estimate at the Huginn-0125 shape: the cost model's FLOPs per token over the F.linear speed
  measured at its shapes in bf16 on this CPU (an estimate, labelled so).

Each round runs the plain forward (over the row's seeds) before and after every engine row, and the
row's share is its rate over the mean of those two forwards' rates: a machine's speed can drift over tens of seconds
(a shared host), and a row is compared only with forwards that ran beside it. The medians over
``--repeats`` rounds are printed, with their spread.

    .venv/bin/python bench/bench_corpus.py [--per-source 6] [--steps 128] [--repeats 5] [--skip-ranks]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import recurrent_model as rm  # noqa: E402
from recurrent_model.speed import forget, linear_speed  # noqa: E402
from workbench.collect import initial_states, run_states  # noqa: E402
from workbench.corpus import read_prompts  # noqa: E402
from workbench.corpus.analyses import Settings, default_lens_steps  # noqa: E402
from workbench.corpus.engine import (  # noqa: E402
    analyse_units,
    batch_rows,
    batch_token_budget,
    run_batch,
)
from workbench.corpus.units import batches, make_units, tokenize  # noqa: E402


def sync(model) -> None:
    """Wait for the model's device (timings on a GPU end when its work does)."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def forward_only(model, units, settings, budget) -> tuple[float, int]:
    """Seconds and token runs of the plain batched forward over the same batches."""
    h, runs_done, started = model.config.n_embd, 0, time.perf_counter()
    for unit in units:
        for runs in batches(unit, settings.seeds, model.config.block_size, budget):
            init = [initial_states(model, [(s, 1.0)], (len(t.ids), h))[0] for t, s in runs]
            run_states(
                model,
                [torch.tensor(t.ids) for t, _ in runs],
                init,
                settings.num_steps,
                cache_device=None,
            )
            runs_done += sum(len(t.ids) for t, _ in runs)
    sync(model)
    return time.perf_counter() - started, runs_done


def rate(measured: tuple[float, int]) -> float:
    """Token runs per second of a (seconds, token runs) measurement."""
    seconds, runs = measured
    return runs / seconds


def engine(model, units, settings, budget, ahead: int = 2) -> tuple[float, int]:
    """Seconds and rows of the corpus engine (host part ``ahead`` batches behind the forward)."""
    started = time.perf_counter()
    rows = sum(len(f) for _, f in analyse_units(model, units, settings, budget, ahead=ahead))
    return time.perf_counter() - started, rows


@dataclass
class Split:
    """Seconds of the engine's parts over the same batches (see ``engine_split``)."""

    tokens: int
    batches: int
    forward: float
    device: float
    host: float


def engine_split(model, units, settings, budget) -> Split:
    """Where the engine's time goes: the plain forward, then each batch's device part (forward,
    lens, normalising, the copy to the host) and host part (classification, rows) one after the
    other."""
    groups = [runs for u in units for runs in batches(u, settings.seeds, model.config.block_size, budget)]  # fmt: skip
    forward, tokens = forward_only(model, units, settings, budget)
    device = host = 0.0
    for runs in groups:
        started = time.perf_counter()
        batch = run_batch(model, runs, settings)  # ends with the copy to the host
        device += time.perf_counter() - started
        started = time.perf_counter()
        batch_rows(batch, settings.eps)
        host += time.perf_counter() - started
    return Split(tokens, len(groups), forward, device, host)


def bracketed_share(model, units, settings, budget, ahead: int) -> float:
    """The engine's rate (host part ``ahead`` batches behind) over the mean rate of the plain
    forwards run just before and after it."""
    before = rate(forward_only(model, units, settings, budget))
    engine_rate = rate(engine(model, units, settings, budget, ahead))
    return engine_rate / ((before + rate(forward_only(model, units, settings, budget))) / 2)


def print_split(split: Split) -> None:
    s = split
    print(f"engine split ({s.tokens} token runs, {s.batches} batches): plain forward {s.forward:.2f} s; "
          f"device part (forward, lens, copy) {s.device:.2f} s, host part (classification, rows) "
          f"{s.host:.2f} s = {s.host / s.device:.2f}× the device part", flush=True)  # fmt: skip


def cli_seconds(nproc: int, out: Path, args) -> float:
    cmd = [sys.executable, "-m", "workbench.corpus", "run", "--out", str(out), "--nproc", str(nproc),
           "--per-source", str(args.per_source), "--max-tokens", "64", "--num-steps", str(args.steps)]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-source", type=int, default=6)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--skip-ranks", action="store_true", help="skip the 1 vs 2 rank CLI runs")
    p.add_argument(
        "--repeats", type=int, default=5, help="bracketed rounds; medians and spread printed"
    )
    args = p.parse_args()
    torch.set_grad_enabled(False)
    model = rm.load_model(ROOT / "checkpoints" / "default")
    prompts = read_prompts("heldout", per_source=args.per_source)
    tokenized, _ = tokenize(prompts, model.tokenizer, model.config.block_size, 64)
    units = make_units(tokenized, 2048)
    steps, r = args.steps, model.config.mean_recurrence
    budget = batch_token_budget(model, steps, None)
    tokens = sum(u.tokens for u in units)
    print(f"shipped model ({model.config.name}, h={model.config.n_embd}), {len(tokenized)} prompts, "
          f"{tokens} tokens, {steps} steps, batch budget {budget} positions, {torch.get_num_threads()} threads")  # fmt: skip
    base = Settings(steps, (0,), ("dynamics",))
    lens = Settings(steps, (0,), ("dynamics", "lens"), default_lens_steps(steps, r))
    rows = {  # (settings, batches the host part may run behind the forward)
        "dynamics + lens": (lens, 2),
        "… host in series": (lens, 0),
        "dynamics only": (base, 2),
        "+ seeds (3 seeds)": (Settings(steps, (0, 1, 2), ("dynamics", "seeds")), 2),
    }
    forward_only(model, units[:1], base, budget)  # warm-up: first-call allocations and kernels
    rates: dict[str, list[float]] = {name: [] for name in rows}
    shares: dict[str, list[float]] = {name: [] for name in rows}
    forwards: dict[tuple[int, ...], list[float]] = {}  # plain forward rates by seeds
    speeds = []
    for _ in range(args.repeats):
        measured: set[tuple[int, ...]] = set()  # seeds whose plain forward ran this round
        for name, (settings, ahead) in rows.items():
            runs = forwards.setdefault(settings.seeds, [])
            if settings.seeds not in measured:
                runs.append(rate(forward_only(model, units, settings, budget)))
                measured.add(settings.seeds)
            before = runs[-1]
            rates[name].append(rate(engine(model, units, settings, budget, ahead)))
            runs.append(rate(forward_only(model, units, settings, budget)))
            shares[name].append(rates[name][-1] / ((before + runs[-1]) / 2))
        forget()  # measured again each round, not the cached speed
        speeds.append(linear_speed(model, rows=budget))
    speed = max(speeds, key=lambda measured: measured.flops_per_second)
    fwd_rates = forwards[base.seeds]
    fwd_rate = statistics.median(fwd_rates)
    mean_len = round(tokens / len(tokenized))
    flops = model.config.cost.forward_flops_per_token(mean_len, steps) * fwd_rate
    print(f"plain batched forward: {fwd_rate:8.1f} tok/s, median of {len(fwd_rates)} runs "
          f"({min(fwd_rates):.1f}–{max(fwd_rates):.1f}; {flops / 1e9:.1f} GFLOP/s; F.linear at the "
          f"model's shapes: {speed.gflops:.1f} GFLOP/s → {flops / speed.flops_per_second:.0%} of the matmul floor)")  # fmt: skip
    for name in rows:
        print(f"{name:18s}: {statistics.median(rates[name]):8.1f} tok/s = "
              f"{statistics.median(shares[name]):.0%} of the plain forward (median of {args.repeats} "
              f"rounds, each against the plain forwards over its seeds just before and after it: "
              f"{min(shares[name]):.0%}–{max(shares[name]):.0%})")  # fmt: skip
    print_split(engine_split(model, units, lens, budget))
    one = make_units(tokenized[:2], 2048)
    s, n = engine(model, one, Settings(steps, (0,), ("dynamics", "stability")), budget)
    print(
        f"{'+ stability':18s}: {n / s:8.1f} tok/s = {n / s / fwd_rate:.1%} of the plain forward (2 prompts)"
    )
    huginn = rm.preset("huginn-0125")
    big = linear_speed(config=huginn, rows=256, dtype="bfloat16")
    per_token = huginn.cost.forward_flops_per_token(64, steps)
    print(f"Huginn-0125 shape, ESTIMATE (not run): {per_token / 1e9:.0f} GFLOP per token at {steps} steps; "
          f"bf16 F.linear here {big.gflops:.1f} GFLOP/s → {big.flops_per_second / per_token:.3f} tok/s per CPU rank")  # fmt: skip
    if not args.skip_ranks:
        with tempfile.TemporaryDirectory() as tmp:
            one_s = cli_seconds(1, Path(tmp) / "one", args)
            two_s = cli_seconds(2, Path(tmp) / "two", args)
        print(f"CLI end to end, {tokens} tokens: 1 process {one_s:.1f} s, 2 gloo ranks {two_s:.1f} s "
              f"({one_s / two_s:.2f}× on this {torch.get_num_threads()}-thread machine)")  # fmt: skip


if __name__ == "__main__":
    main()
