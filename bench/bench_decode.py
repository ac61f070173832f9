"""Decode speed of KV-cached generation against full re-computation, in one run.

A random model of the "small" preset: h = 256, (l_P, l_R, l_C) = (1, 2, 1), 4 heads of 64, MLP 704,
V = 4096, r = 8; a 32-token prompt, 64 new tokens, float32, 2 threads, greedy with init_scale = 0 so
that every method must produce the same tokens (checked). Each cached method is timed ``--repeats``
times and the best run is kept (the machines are shared); decode tokens/s counts the tokens after the
first, from the first token's arrival to the last one's.

With a trained checkpoint (``--checkpoint``, default ``checkpoints/default`` when it exists) it also
measures speculative decoding and adaptive exit there, where drafts and exits mean something.

    python bench/bench_decode.py [--repeats 5] [--threads 2] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

# OpenMP threads that spin while waiting collapse when the shared 2-core machine is loaded (measured:
# 5-18 tok/s spinning vs 53 passive at load 10); export OMP_WAIT_POLICY=ACTIVE to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import recurrent_model as rm  # noqa: E402

PROMPT, NEW, STEPS = 32, 64, 8


def timed_generate(
    model: rm.RecurrentLM, ids: torch.Tensor, steps: int = STEPS, **kw
) -> tuple[float, float, object]:
    """(total seconds, decode tokens/s after the first token, details) of one generate call."""
    stamps: list[float] = []
    start = time.perf_counter()
    out = model.generate(ids, NEW, num_steps=steps, init_scale=0.0, stop_tokens=(),
                         streamer=lambda t, s: stamps.append(time.perf_counter()),
                         return_details=True, **kw)  # fmt: skip
    total = time.perf_counter() - start
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return total, decode, out


def recompute(model: rm.RecurrentLM, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Greedy decoding that reruns the whole sequence for every token (no cache)."""
    start = time.perf_counter()
    seq = ids
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(seq, num_steps=STEPS, init_scale=0.0).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return time.perf_counter() - start, seq


def best_of(repeats: int, fn: Callable[[], tuple[float, float, object]]):
    runs = [fn() for _ in range(repeats)]
    return max(runs, key=lambda r: r[1])


def print_table(rows: list, base: float) -> None:
    header = f"{'method':42} {'total s':>8} {'tok/s':>8} {'speed-up':>9} {'same tokens':>11}"
    print(header + f" {'mean steps':>10} {'acceptance':>10}")
    print("-" * (len(header) + 22))
    for name, total, rate, same, steps, acc in rows:
        acc_s = f"{acc:.2f}" if acc is not None else "-"
        print(f"{name:42} {total:8.2f} {rate:8.1f} {rate / base:8.1f}x {str(same):>11} "
              f"{steps:10.2f} {acc_s:>10}")  # fmt: skip


def bench_checkpoint(path: str, repeats: int) -> None:
    """Speculative decoding and adaptive exit on a trained checkpoint, against plain cached greedy."""
    model = rm.load_model(path)
    steps = model.config.mean_recurrence
    text = "The history of the city begins"
    if model.tokenizer is None:
        print(f"\n(checkpoint {path} has no tokenizer.json: skipped)")
        return
    ids = torch.tensor([model.tokenizer.encode(text)])
    timed_generate(model, ids, steps)
    plain = best_of(repeats, lambda: timed_generate(model, ids, steps))
    rows = [(f"KV cache, r={steps}", plain[0], plain[1], True, plain[2].mean_steps, None)]
    variants = [
        ("speculative, draft 4 / lookahead 8", {"draft_steps": 4, "lookahead": 8}),
        ("speculative, draft 2 / lookahead 8", {"draft_steps": 2, "lookahead": 8}),
        ("adaptive exit kl 5e-4", {"exit_criterion": "kl"}),
        (
            "adaptive exit kl 5e-4 + continuous",
            {"exit_criterion": "kl", "continuous_compute": True},
        ),
    ]
    for name, kw in variants:
        total, decode, out = best_of(repeats, lambda kw=kw: timed_generate(model, ids, steps, **kw))
        same = torch.equal(out.sequences, plain[2].sequences)
        rows.append((name, total, decode, same, out.mean_steps, out.acceptance_rate))
    print(f"\ncheckpoint {path}: prompt {text!r} ({ids.shape[1]} tokens), {NEW} new tokens")
    print_table(rows, plain[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint", default="checkpoints/default")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("small")).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    timed_generate(model, ids)  # warm-up

    rows = []
    t_re, seq_re = recompute(model, ids)
    rows.append(("full re-computation (no cache)", t_re, NEW / t_re, True, STEPS, None))
    variants = [
        ("KV cache, fast path", {}),
        ("KV cache, cache_budget=4", {"cache_budget": 4}),
        ("speculative, draft 4 / lookahead 4", {"draft_steps": 4, "lookahead": 4}),
        ("speculative, draft 2 / lookahead 8", {"draft_steps": 2, "lookahead": 8}),
        ("adaptive exit kl 5e-4", {"exit_criterion": "kl"}),
        ("adaptive exit latent-diff 0.03", {"exit_criterion": "latent-diff"}),
    ]
    for name, kw in variants:
        total, decode, out = best_of(args.repeats, lambda kw=kw: timed_generate(model, ids, **kw))
        same = torch.equal(out.sequences, seq_re)
        rows.append((name, total, decode, same, out.mean_steps, out.acceptance_rate))
    with model.hooks([("core.hook_state", lambda x, hook: None)]):
        total, decode, out = best_of(max(1, args.repeats // 2), lambda: timed_generate(model, ids))
    rows.append(("KV cache, model layers (hook attached)", total, decode,
                 torch.equal(out.sequences, seq_re), out.mean_steps, None))  # fmt: skip

    print(f"decode benchmark: h=256 (1,2,1) r={STEPS}, V=4096, prompt {PROMPT}, {NEW} new tokens, "
          f"float32, {args.threads} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
          f"best of {args.repeats}; load average at start "
          f"{load0:.1f}, at end {os.getloadavg()[0]:.1f}")  # fmt: skip
    print_table(rows, rows[0][2])
    kb = rm.KVCache(model.config, 1, PROMPT + NEW, STEPS).memory_bytes
    kb4 = rm.KVCache(model.config, 1, PROMPT + NEW, STEPS, 4).memory_bytes
    print(f"KV cache memory: full {kb / 2**20:.2f} MiB, budget 4: {kb4 / 2**20:.2f} MiB")
    if os.path.isdir(args.checkpoint):
        bench_checkpoint(args.checkpoint, args.repeats)
    else:
        print(
            f"\n(no checkpoint at {args.checkpoint}: speculative / adaptive exit on a trained model skipped)"
        )


if __name__ == "__main__":
    main()
