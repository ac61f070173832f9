"""The GPU check: one prepared script (≤ 8 minutes) to run whenever a machine with an accelerator
is available; what it prints goes into docs/performance.md.

1. The corpus engine on a random Huginn-0125-shape model in bf16 on one GPU: tokens/s, peak
   memory against the engine's own batch estimate.
   The engine's split on the same batches: the plain batched forward, each batch's device part
   (forward, lens, normalising, one copy to the host) and its host part (classification, rows)
   timed one after the other, and the engine with the host part in series and on its background
   thread beside the next batch's forward, each against the forwards run just before and after
   it: whether the host is the bottleneck on this device. A random model's
   tokens rarely settle, so every token takes the classifier's full path (a trained model's
   settled tokens skip most of it): an upper bound on the host part.
2. Every workbench analysis once on the device (collect, dynamics, convergence, path
   independence, lenses, fixed point, spectrum, Lyapunov, attribution, patching, steering,
   ablation), each OK or its one-line error, with its time.
3. The compiled decode: tokens/s of generate(compile=True) against eager.

    python bench/gpu_check.py                       # cuda, the Huginn-0125 shape, bf16
    python bench/gpu_check.py --device cpu --shape small --dtype float32   # a dry run of the script
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_corpus import bracketed_share, engine_split, print_split  # noqa: E402

import recurrent_model as rm  # noqa: E402
import workbench as wb  # noqa: E402
from recurrent_model.standin import byte_level_tokenizer  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def build(shape: str, device: str, dtype: torch.dtype) -> rm.RecurrentLM:
    """A random model of the preset's shape (no checkpoint to read: the check needs the shape)."""
    with torch.device("meta"):
        model = rm.RecurrentLM(rm.preset(shape))
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.tokenizer = byte_level_tokenizer()
    return model.eval()


def timed(name: str, fn: Callable[[], object], device: str) -> None:
    started = time.perf_counter()
    try:
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        print(f"  OK   {name:22s} {time.perf_counter() - started:7.2f} s", flush=True)
    except Exception as exc:  # every analysis is tried; one line each
        line = traceback.format_exception_only(type(exc), exc)[-1].strip()
        print(f"  FAIL {name:22s} {line}", flush=True)


def corpus_check(model: rm.RecurrentLM, steps: int) -> None:
    from workbench import corpus
    from workbench.corpus.analyses import Settings
    from workbench.corpus.engine import Job, batch_token_budget

    budget = batch_token_budget(model, steps, None)
    estimate = budget * (steps + 1) * model.config.n_embd * 4
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job("heldout", Settings(steps, (0,), ("dynamics", "lens"), (1, steps // 2)),
                  per_source=4, max_tokens=64)  # fmt: skip
        started = time.perf_counter()
        out = corpus.run(model, job, Path(tmp) / "run", progress=False)
        seconds = time.perf_counter() - started
        rows = len(corpus.load(out))
    peak = torch.cuda.max_memory_allocated() if model.device.type == "cuda" else float("nan")
    print(f"corpus engine: {rows} token runs in {seconds:.1f} s = {rows / seconds:.1f} tok/s at "
          f"{steps} steps; batch budget {budget} positions; peak device memory {peak / 2**30:.2f} GiB "
          f"(weights {sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30:.2f} GiB "
          f"+ the states estimate {estimate / 2**30:.2f} GiB)", flush=True)  # fmt: skip


def split_check(model: rm.RecurrentLM, steps: int) -> None:
    from workbench.corpus import read_prompts
    from workbench.corpus.analyses import Settings
    from workbench.corpus.engine import batch_token_budget
    from workbench.corpus.units import make_units, tokenize

    settings = Settings(steps, (0,), ("dynamics", "lens"), (1, steps // 2))
    prompts = read_prompts("heldout", per_source=4)
    units = make_units(tokenize(prompts, model.tokenizer, model.config.block_size, 64)[0], 2048)
    budget = batch_token_budget(model, steps, None)
    print_split(engine_split(model, units, settings, budget))
    serial, overlapped = (bracketed_share(model, units, settings, budget, a) for a in (0, 2))
    print(f"engine against the forwards beside it: host part in series {serial:.0%}, on its "
          f"background thread two batches behind {overlapped:.0%}", flush=True)  # fmt: skip


def analyses_check(model: rm.RecurrentLM, steps: int, device: str) -> None:
    ids = torch.tensor(model.tokenizer.encode("Claire makes a 3 egg omelet every morning."))
    other = ids.clone()
    other[-3] = (other[-3] + 1) % model.config.vocab_size
    holder: dict[str, object] = {}

    def collect() -> None:
        holder["traj"] = wb.collect(model, ids, steps, seeds=(0, 1), progress=False)

    timed("collect", collect, device)
    states = holder["traj"].states if "traj" in holder else None  # type: ignore[union-attr]
    checks: list[tuple[str, Callable[[], object]]] = [
        ("classify_dynamics", lambda: wb.classify_dynamics(states[0])),
        ("convergence", lambda: wb.convergence(states[0])),
        ("path_independence", lambda: wb.path_independence(states)),
        ("lens", lambda: wb.lens(model, holder["traj"].raw_states[0])),  # type: ignore[union-attr]
        ("fixed_point", lambda: wb.fixed_point(model, ids[None], max_iter=50)),
        ("fixed_point_spectrum", lambda: wb.fixed_point_spectrum(model, ids[None], position=3, k=4)),
        ("lyapunov_spectrum", lambda: wb.lyapunov_spectrum(model, ids[None], 16, position=3, k=2)),
        ("stretch_attribution", lambda: wb.stretch_attribution(model, ids[None], position=3)),
        ("patch_states", lambda: wb.patch_states(model, ids[None], other[None], 8, positions="all")),
        ("steering_effect", lambda: wb.steering_effect(model, ids[None], 8, [("core.hook_state", wb.add_vector_hook(torch.ones(model.config.n_embd), 0.1))])),
        ("ablate_subspace", lambda: wb.ablate_subspace(model, ids[None], 8, 3, torch.eye(model.config.n_embd)[:2].numpy(), n_random=4)),
    ]  # fmt: skip
    for name, fn in checks:
        timed(name, fn, device)


def decode_check(model: rm.RecurrentLM, device: str) -> None:
    ids = torch.tensor([model.tokenizer.encode("The answer is")], device=device)
    for compiled in (False, True):
        started = time.perf_counter()
        try:
            out = model.generate(ids, 16, num_steps=8, compile=compiled)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            new = out.shape[1] - ids.shape[1]
            rate = new / (time.perf_counter() - started)
            print(
                f"decode compile={compiled}: {rate:.1f} tok/s (first call, compile time included)"
            )
        except Exception as exc:
            print(f"decode compile={compiled}: FAIL {type(exc).__name__}: {exc}".splitlines()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", default="huginn-0125")
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: no GPU visible to torch; run with --device cpu for a dry run")
    torch.set_grad_enabled(False)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    hip = f", ROCm {torch.version.hip}" if torch.version.hip else ""
    print(f"gpu_check: {args.shape} in {args.dtype} on {where}{hip}, torch {torch.__version__}")
    model = build(args.shape, args.device, DTYPES[args.dtype])
    corpus_check(model, args.steps)
    split_check(model, args.steps)
    analyses_check(model, args.steps, args.device)
    decode_check(model, args.device)


if __name__ == "__main__":
    main()
