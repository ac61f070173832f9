"""How fast Stop ends each heavy action of the app, and whether the CPU is idle after it.

Each heavy action (collection, lenses, generation, patching, ablation, steering, steered
continuation, stability, the diffusion sampler, UMAP) runs through the app's compute function as a
Streamlit script (tests/stop_driver.py, the mechanism of tests/test_app_stop.py). ``--settle``
seconds after its bar first moves, Stop is pressed the way the browser's button does it. Measured:
the seconds from Stop to the end of the script thread, and this process's CPU seconds (threads and
child processes, UMAP's worker included) in the 10 s after Stop and from 10 to 15 s after it.
Batch sizes are the ones the app plans (patching_plan, ablation_plan).

By default on the shipped checkpoint (checkpoints/default); ``--huginn`` at the Huginn-0125 shape
in bfloat16 (a random checkpoint written to a temporary directory and deleted after, about 7 GiB on
disk and in memory; building it takes minutes).

Usage: python bench/bench_app_stop.py [--huginn] [--settle S] [--only collection,umap]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")  # the app's functions run bare here

import psutil  # noqa: E402
import stop_driver  # noqa: E402
import streamlit.logger  # noqa: E402
import torch  # noqa: E402
from bench_app_cost import huginn_checkpoint  # noqa: E402

from apps import (  # noqa: E402
    compute,
    cost,
    inputs,
    intervention_compute,
    stability_compute,
    umap_worker,  # noqa: E402
)
from apps.cached import with_key  # noqa: E402
from recurrent_model.hook_names import STATE  # noqa: E402
from workbench.patching import patching_pair  # noqa: E402

GOAL_S = 10.0  # Stop must end the action within this, and the CPU be idle from then on
IDLE_CPU_S = 0.25  # at most this many CPU seconds from 10 to 15 s after Stop (5 % of one core)
Task = tuple[Callable[[], None], Callable[[], bool]]


@dataclass
class Row:
    action: str
    took: float
    ended: bool
    finished: bool
    cpu_first: float
    cpu_after: float
    error: str = ""

    def verdict(self) -> str:
        if self.error:
            return f"failed: {self.error}"
        if self.finished:
            return "ran to its end before Stop (not measured)"
        problems = []
        if not self.ended or self.took > GOAL_S:
            problems.append(f"Stop took over {GOAL_S:g} s")
        if self.cpu_after > IDLE_CPU_S:
            problems.append(f"CPU busy 10 s after Stop (> {IDLE_CPU_S:g} CPU-s in 5 s)")
        return "; ".join(problems) or "meets the 10 s goal"


def cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and its live ones (UMAP's worker)."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += c.user + c.system
    return total


class CpuWindows:
    """CPU seconds used 0–10 s and 10–15 s after ``start`` (sampled by a thread of its own)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.samples.append(cpu_seconds())
        self.thread.start()

    def _sample(self) -> None:
        for offset in (GOAL_S, GOAL_S + 5.0):
            time.sleep(max(0.0, self.t0 + offset - time.monotonic()))
            self.samples.append(cpu_seconds())

    def result(self) -> tuple[float, float]:
        self.thread.join()
        a, b, c = self.samples
        return b - a, c - b


def measure(name: str, make: Callable[[Setup], Task], setup: Setup, settle: float) -> Row:
    """Run one action, press Stop ``settle`` s after its bar moves, measure latency and CPU."""
    task, running = make(setup)
    windows = CpuWindows()
    stopped = stop_driver.run_then_stop(
        task, running, settle=settle, start_timeout=600, join_timeout=120, on_stop=windows.start
    )
    first, after = windows.result()
    error = "" if stopped.error is None else f"{type(stopped.error).__name__}: {stopped.error}"
    row = Row(name, stopped.took, stopped.ended, stopped.finished, first, after, error)
    print(f"{name:24s} stop {row.took:6.2f} s  CPU 0–10 s {first:6.2f}  10–15 s {after:5.2f}  "
          f"{row.verdict()}", flush=True)  # fmt: skip
    if not stopped.ended:
        sys.exit(f"{name}: the action still runs 120 s after Stop; the bench ends here")
    return row


def bar(what: str, guess: cost.CostEstimate | cost.TimeEstimate) -> compute.TaskProgress:
    return compute.TaskProgress(what, "units", guess)


def moving(progress: compute.TaskProgress) -> Callable[[], bool]:
    return lambda: progress.updates > 0


@dataclass
class Setup:
    """The model and trajectory every action runs on, and the sizes that keep each one running
    well past the settle time on this model (``big``: the shipped model, which is fast)."""

    model: object
    traj: object
    run: inputs.RunSettings
    big: bool

    @property
    def many(self) -> int:
        """Steps or new tokens of the long actions."""
        return 200 if self.big else 32

    @property
    def vector(self):
        return self.traj.states[0][-1, -1]

    def guess(self) -> cost.CostEstimate:
        return compute.estimate(self.model, len(self.run.token_ids), self.run.num_steps, 1)


def collection(s: Setup) -> Task:
    longer = inputs.RunSettings(s.run.token_ids, s.many, tuple(range(16 if s.big else 4)), 1.0)
    p = compute.CollectProgress("collection", s.guess())
    return lambda: compute.trajectory(s.model, longer, _progress=p), moving(p)


def lens(kind: str) -> Callable[[Setup], Task]:
    def make(s: Setup) -> Task:
        p, tokens = bar(f"{kind} lens", s.guess()), [str(i) for i in s.run.token_ids]
        return lambda: compute.lens(s.model, s.traj, tokens, kind, _progress=p), moving(p)

    return make


def generation(s: Setup) -> Task:
    p, ids = bar("generation", s.guess()), s.run.token_ids
    return lambda: compute.generation(
        s.model, ids, s.many, s.run.num_steps, None, None, 1.0, _progress=p
    ), moving(p)


def patching(s: Setup) -> Task:
    pair, steps = patching_pair(s.model), s.run.num_steps
    clean, corrupted = pair.clean_ids, pair.corrupted_ids
    patches = intervention_compute.patches_to_run(clean, corrupted, steps, "each")
    plan, batch = intervention_compute.patching_plan(s.model, len(clean), steps, patches)
    p = bar("patching", plan)
    return lambda: intervention_compute.patching(
        s.model, clean, corrupted, steps, STATE, "each", "denoising", 1.0, 0, "logit_diff",
        pair.target, pair.corrupted_target, batch_size=batch, _progress=p,
    ), moving(p)  # fmt: skip


def ablation(s: Setup) -> Task:
    ids, steps, planes = s.run.token_ids, s.run.num_steps, 32 if s.big else 8
    plan, batch = intervention_compute.ablation_plan(s.model, len(ids), steps, planes)
    p = bar("ablation", plan)
    return lambda: intervention_compute.ablation(
        s.model, ids, steps, len(ids) - 1, planes, batch_size=batch, _progress=p
    ), moving(p)


def steering(s: Setup) -> Task:
    p, steps = bar("steering", s.guess()), s.run.num_steps
    return lambda: intervention_compute.steering(
        s.model, s.run.token_ids, steps, s.vector, None, "add", 1.0, (1, steps), _progress=p
    ), moving(p)


def steered(s: Setup) -> Task:
    p, steps = bar("steered continuation", s.guess()), s.run.num_steps
    return lambda: intervention_compute.steered_text(
        s.model, s.run.token_ids, steps, s.vector, None, "add", 1.0, (1, steps), s.many,
        _progress=p,
    ), moving(p)  # fmt: skip


def stability(s: Setup) -> Task:
    last = len(s.run.token_ids) - 1
    p = stability_compute.stability_progress(last, s.guess())
    return lambda: stability_compute.token_stability(
        s.model, s.traj, s.run, last, 8 if s.big else 2, _progress=p
    ), lambda: p.updates > 1


def diffusion(s: Setup) -> Task:
    p = bar("diffusion", s.guess())
    return lambda: compute.diffusion_run(
        s.model, s.run.token_ids, s.many, s.run.num_steps, 4, 1, 0.0, "latent-diff", 1.0,
        _progress=p,
    ), moving(p)  # fmt: skip


def umap(s: Setup) -> Task:
    umap_worker.WORKER.stop()
    states = (s.traj.num_steps + 1) * s.traj.n_tokens
    p = compute.TaskProgress("UMAP", "s", cost.umap_estimate(states))
    started = lambda: umap_worker.WORKER.pid is not None and p.updates > 0  # noqa: E731
    return lambda: compute.umap(s.traj, _progress=p), started


ACTIONS: list[tuple[str, Callable[[Setup], Task]]] = [
    ("collection", collection), ("coda lens", lens("coda")), ("logit lens", lens("logit")),
    ("generation", generation), ("patching", patching), ("ablation", ablation),
    ("steering", steering), ("steered continuation", steered), ("stability", stability),
    ("diffusion sampler", diffusion), ("UMAP", umap),
]  # fmt: skip


def markdown(label: str, rows: list[Row]) -> str:
    """The rows as a markdown table (for docs/app.md)."""
    lines = [label, "", "| action | Stop → thread end | CPU-s 0–10 s after Stop | "
             "CPU-s 10–15 s after Stop | verdict |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        took = f"{r.took:.2f} s" if r.ended else f"> {r.took:.0f} s"
        lines.append(
            f"| {r.action} | {took} | {r.cpu_first:.2f} | {r.cpu_after:.2f} | {r.verdict()} |"
        )
    return "\n".join(lines)


def bench_model(model, key: str, big: bool, settle: float, only: set[str]) -> None:
    """Collect the trajectory the trajectory-based actions need, then stop every action."""
    model = with_key(model, key)
    ids = inputs.encode_input(
        model.tokenizer, model.config.block_size, inputs.DEFAULT_PROMPT, "", False
    )
    run = inputs.RunSettings(tuple(ids), 64 if big else 8, (0,), 1.0)
    start = time.perf_counter()
    traj = compute.trajectory(model, run)
    load = os.getloadavg()
    label = (
        f"{model.name}: {model.num_parameters() / 1e6:,.1f} M parameters, {model.dtype}, "
        f"{len(ids)} tokens, {run.num_steps} steps, {torch.get_num_threads()} threads, Stop "
        f"{settle:g} s after the bar first moves, load average {load[0]:.1f} at start"
    )
    print(f"trajectory collected in {time.perf_counter() - start:.0f} s", flush=True)
    print(label, flush=True)
    setup = Setup(model, traj, run, big)
    rows = [
        measure(name, make, setup, settle) for name, make in ACTIONS if not only or name in only
    ]
    umap_worker.WORKER.stop()
    label += f", {os.getloadavg()[0]:.1f} at end"
    print()
    print(markdown(label, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--huginn", action="store_true", help="the Huginn-0125 shape in bf16")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of work before Stop")
    parser.add_argument("--only", default="", help="comma-separated action names to run")
    args = parser.parse_args()
    streamlit.logger.set_log_level("error")  # every streamlit logger, those made later too
    warnings.filterwarnings("ignore")
    only = set(filter(None, args.only.split(",")))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temporary checkpoint goes
    if args.huginn:
        with tempfile.TemporaryDirectory(prefix="huginn-random-") as tmp:
            start = time.perf_counter()
            huginn_checkpoint(Path(tmp))
            print(f"random Huginn-0125-shape checkpoint written in "
                  f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
            model = compute.load(tmp, "cpu", None, compute.checkpoint_signature(Path(tmp)))
            bench_model(model, tmp, False, args.settle, only)
        return
    model = compute.load(str(ROOT / "checkpoints/default"), "cpu", None, "bench")
    bench_model(model, "checkpoints/default", True, args.settle, only)


if __name__ == "__main__":
    main()
