"""Tokens/s and agreement with plain greedy decoding: plain decode, speculative decoding and the
diffusion-forcing sampler on a trained checkpoint, measured side by side in one run.

Every method decodes the same prompts greedily with init_scale = 0 (deterministic) and no stop
tokens; its tokens/s is new tokens / wall time of the whole call (prefill included, since the
sampler's prefill is part of its schedule), best of ``--repeats`` interleaved rounds per prompt
(the machine may be shared), summed over the prompts. Agreement is the share of new tokens equal to
plain greedy decoding's at the same position, and the mean length of the identical prefix. "core
passes/token": sequential core-block applications (each over a whole chunk) per new token, prefill
included (plain decode: about r; the sampler: num_steps + inner_recurrence × sampler steps).

    python bench/bench_sampler.py [--checkpoint checkpoints/default] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

# Spinning OpenMP threads collapse on a loaded shared machine; export ACTIVE on an idle one.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import recurrent_model as rm  # noqa: E402

PROMPTS = ("The history of the city begins", "def add(a, b):\n    return")
NEW = 48


@dataclass
class Run:
    seconds: float
    new: list[int]
    core_passes: int


def plain(model: rm.RecurrentLM, ids: torch.Tensor, steps: int, **kw) -> Run:
    start = time.perf_counter()
    out = model.generate(ids, NEW, num_steps=steps, init_scale=0.0, stop_tokens=(),
                         return_details=True, **kw)  # fmt: skip
    seconds = time.perf_counter() - start
    new = out.sequences[0, ids.shape[1] :].tolist()
    # plain (eager or compiled): the prompt prefill, then r iterations per token; speculative: not
    # counted (-1)
    return Run(seconds, new, -1 if "draft_steps" in kw else steps * (len(new) + 1))


def diffusion(model: rm.RecurrentLM, ids: torch.Tensor, steps: int, **kw) -> Run:
    start = time.perf_counter()
    out = model.generate_diffusion(ids, NEW, num_steps=steps, init_scale=0.0, stop_tokens=(),
                                   return_details=True, **kw)  # fmt: skip
    seconds = time.perf_counter() - start
    # core_passes counts the prefill as one pass; here it counts its num_steps iterations
    return Run(seconds, out.sequences[0, ids.shape[1] :].tolist(), out.core_passes - 1 + steps)


def agreement(new: list[int], base: list[int]) -> tuple[float, int]:
    """(share of positions equal to base, length of the identical prefix)."""
    same = [a == b for a, b in zip(new, base)]
    prefix = next((i for i, s in enumerate(same) if not s), len(same))
    return sum(same) / max(len(base), 1), prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = rm.load_model(args.checkpoint).eval()
    if model.tokenizer is None:
        raise SystemExit(f"{args.checkpoint} has no tokenizer.json: prompts cannot be encoded")
    r = model.config.mean_recurrence
    variants: dict[str, Callable[[torch.Tensor], Run]] = {
        f"plain greedy, r={r}": lambda ids: plain(model, ids, r),
        "plain greedy, compiled (compile=True)": lambda ids: plain(model, ids, r, compile=True),
        "speculative, draft 4 / lookahead 8": lambda ids: plain(
            model, ids, r, draft_steps=4, lookahead=8
        ),
        "diffusion, inner 4, headway 1 (defaults)": lambda ids: diffusion(model, ids, r),
        "diffusion, inner 2, headway 1": lambda ids: diffusion(model, ids, r, inner_recurrence=2),
        "diffusion, inner 4, headway 2": lambda ids: diffusion(model, ids, r, headway=2),
        "diffusion, inner 4, full cache": lambda ids: diffusion(
            model, ids, r, cache_lookup_strategy="full"
        ),
    }
    prompts = [torch.tensor([model.tokenizer.encode(p)]) for p in PROMPTS]
    load0 = os.getloadavg()[0]
    for fn in variants.values():  # warm-up (and the compiled decode's one-time compile)
        for ids in prompts:
            fn(ids)
    best: dict[tuple[str, int], Run] = {}
    for _ in range(args.repeats):
        for i, ids in enumerate(prompts):
            for name, fn in variants.items():
                run = fn(ids)
                key = (name, i)
                if key not in best or run.seconds < best[key].seconds:
                    best[key] = run
    print(f"sampler benchmark on {args.checkpoint} (h={model.config.n_embd}, r={r}): "
          f"{len(prompts)} prompts x {NEW} new tokens, greedy, init_scale 0, float32, "
          f"{args.threads} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), best of {args.repeats} interleaved rounds; load average at "
          f"start {load0:.1f}, at end {os.getloadavg()[0]:.1f} (shared machine)")  # fmt: skip
    head = (f"{'method':42} {'tok/s':>7} {'speed-up':>8} {'agree':>6} {'prefix':>6} "
            f"{'core passes/token':>17}")  # fmt: skip
    print(head)
    print("-" * len(head))
    base_name = next(iter(variants))
    base_rate = None
    for name in variants:
        runs = [best[(name, i)] for i in range(len(prompts))]
        tokens = sum(len(run.new) for run in runs)
        rate = tokens / sum(run.seconds for run in runs)
        base_rate = base_rate or rate
        scores = [agreement(run.new, best[(base_name, i)].new) for i, run in enumerate(runs)]
        share = sum(s for s, _ in scores) / len(scores)
        prefix = sum(p for _, p in scores) / len(scores)
        passes = sum(run.core_passes for run in runs)
        per_token = f"{passes / tokens:17.2f}" if passes >= 0 else f"{'-':>17}"
        print(f"{name:42} {rate:7.1f} {rate / base_rate:7.2f}x {share:6.2f} {prefix:6.1f} "
              f"{per_token}")  # fmt: skip


if __name__ == "__main__":
    main()
