"""Where a compiled batch-1 decode token's time goes beyond its weight reads, in one run.

The small preset of ``bench_decode.py`` (h = 256, r = 8, float32, 2 threads, a 32-token prompt and 64
new tokens). Each round times, side by side:
- ``generate(compile=True)`` per token (the user's path, as ``bench_decode.py`` times it);
- the same compiled token graphs called in a bare loop with a fixed input id ("graph only");
- that loop over the graphs of a copy of the model compiled with one OpenMP barrier per loop
  ("graph, unchained": inductor's own regions, without ``inductor_serial_chains``' chains and
  spinning barriers), and of one whose
  launcher makes a tensor of each pooled intermediate ("graph, pooled tensors": without
  ``inductor_pool_pointers``; its raw entry, which the token calls, takes pointers either way),
  and of one whose launcher checks every input's sizes and strides on each call ("graph, size
  asserts": inductor's default, where the direct callers check instead),
  and of one whose launcher has no raw entry ("graph, inductor's entry": called through inductor's
  Python wrapper, a handle per input, without ``inductor_raw_entry``), and of one whose attention
  sums its values in one group ("graph, one value chain": without ``functional.attend``'s groups of
  the head dimension);
- that loop with the graph's greedy tokens fed back as the next ids, the results written into two
  sets of buffers in turn as generate writes them ("graph, greedy fed back"), and into new tensors
  per token ("graph, greedy, new results"): the compiled decode takes the argmax in the graph;
- that loop with an eager argmax of the logits fed back instead ("graph + argmax"): what the first
  op after a token costs, and with a second, identical argmax ("+ the same op again") what it costs
  warm;
- with ``--intervals``, the graphs of a copy compiled with timed barriers (``token_intervals``),
  whose clock splits the kernel's time by what ran between its barriers: products, attention,
  serial chains (thread 0 alone) and the waits at the barriers after each, and times each call's
  host work before and after the kernel's parallel region;
- the token's projections alone, written as the compiled decode writes them, in one compiled graph,
  the read floor of the token's weights (each read once in one compiled kernel) and the same reads
  as one torch.sum per weight (all three ``bench_decode.floor_calls``).

The differences, as paired per-round medians, split a token into: its products against the read
floor, the rest of the graph (attention, norms, RoPE, the threads' synchronisation),
the first host op after the graph (the weights a token streams evict the host's code and data from
the cores' caches, so the first op after each token runs cold), the same op warm, and the rest of
generate's per-token Python (sampling, emitting, the streamer). The methods run in one order, then
the reverse, round after round.

    python bench/bench_decode_token.py [--rounds 40] [--threads 2] [--intervals]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "10000000")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import recurrent_model as rm  # noqa: E402
from recurrent_model import (  # noqa: E402
    compiled,
    functional,
    inductor_pool_pointers,
    inductor_raw_entry,
    inductor_serial_chains,
)
from recurrent_model.compiled import CompiledDecode  # noqa: E402
from recurrent_model.generation import GenerationConfig, _Run  # noqa: E402
from recurrent_model.sampling import Sampler  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import NEW, PROMPT, STEPS, compiled_generate, floor_calls, mean_time  # noqa: E402
from token_intervals import (  # noqa: E402
    KINDS,
    BarrierClock,
    Split,
    barrier_kinds,
    products_by_predecessor,
    region_edges,
    split,
    timed_compile,
)
from torch._inductor.utils import run_and_get_code  # noqa: E402

#: the token loop over a twin called through inductor's Python wrapper and entry (no raw entry)
WRAPPED = "graph, inductor's entry"
#: the token loop over a twin whose attention sums its values in one group (:func:`one_value_chain`)
ONE_CHAIN = "graph, one value chain"


def compiled_token(model: rm.RecurrentLM, ids: torch.Tensor) -> CompiledDecode:
    """The compiled decode generate builds for this prompt, built by generate's own run (same cache
    length and storage, same graphs), with the prompt prefilled. generate reuses the storage,
    rewriting the same prompt."""
    cfg = GenerationConfig(num_steps=STEPS, init_scale=0.0, stop_tokens=(), compile=True)
    with torch.inference_mode():
        run = _Run(model, ids, NEW, cfg.resolved(model), Sampler(), 0, None, None)
        run.prefill(ids)
    if run.compiled is None:
        raise RuntimeError("generate built no compiled decode for this model and prompt")
    return run.compiled


def model_copy(model: rm.RecurrentLM) -> rm.RecurrentLM:
    """A copy of ``model`` with its weights: its own compiled graphs, the same tokens."""
    twin = rm.RecurrentLM(model.config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def twin_token(
    model: rm.RecurrentLM, ids: torch.Tensor, baseline: contextlib.AbstractContextManager
) -> CompiledDecode:
    """:func:`compiled_token` for a copy of ``model`` compiled inside ``baseline``."""
    twin = model_copy(model)
    with baseline:
        compiled_generate(twin, ids)
        return compiled_token(twin, ids)


def without_options(without: dict[str, object]) -> contextlib.AbstractContextManager:
    """Compiles with ``compiled.cpu_options`` less the inductor options ``without`` (a code
    generator's ``compile_options()``)."""
    options = {k: v for k, v in compiled.cpu_options().items() if k not in without}
    return mock.patch.object(compiled, "cpu_options", lambda: options)


def one_value_chain(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """``functional.attend`` with the weighted sum of values in one group: inductor sums each
    output vector over the keys as one chain after another (the baseline of the grouped values)."""
    if not functional._compiled_cpu_row(q, q.shape[-2]) or causal:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1).unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)


def timed_token(
    model: rm.RecurrentLM, ids: torch.Tensor, clock: BarrierClock
) -> tuple[CompiledDecode, str]:
    """:func:`compiled_token` for a copy of ``model`` compiled with barriers that add to ``clock``,
    and the source of its token kernel (the largest the compile wrote)."""
    twin = model_copy(model)
    with timed_compile(clock):
        _, sources = run_and_get_code(compiled_generate, twin, ids)
        return compiled_token(twin, ids), max(sources, key=len)


def print_intervals(source: str, clock: BarrierClock, calls: int, token: float) -> None:
    """The timed token's kernel time per kind of interval: what thread 0 and the other threads
    worked, and waited at the barrier that ends each interval; the products also by what ran
    before each (:func:`token_intervals.products_by_predecessor`)."""

    def row(parts: Split, name: str, label: str) -> None:
        (w0, w1), (a0, a1) = parts.work[name], parts.wait[name]
        print(f"{label} x{parts.count[name]:3}  work {1e6 * w0:7.1f} | {1e6 * w1:7.1f} us, "
              f"wait {1e6 * a0:6.1f} | {1e6 * a1:6.1f} us")  # fmt: skip

    parts = split(source, clock, calls)
    print(f"timed token kernel, per token ({calls} tokens; thread 0 | the others' mean):")
    for kind in KINDS:
        row(parts, kind, f"  {kind:9}")
    starts = split(source, clock, calls, products_by_predecessor(barrier_kinds(source)))
    for name in (n for n in starts.count if n.startswith("product after")):
        row(starts, name, f"    {name:23}")
    kernel = sum(parts.work[k][0] + parts.wait[k][0] for k in KINDS)
    print(f"  thread 0 in the kernel's region: {1e6 * kernel:.1f} us of the timed token's "
          f"{1e6 * token:.1f} us (the rest: host work, the region's start and end)")  # fmt: skip


def print_region_edges(decode: CompiledDecode, ids: torch.Tensor, clock: BarrierClock,
                       rounds: int) -> None:  # fmt: skip
    """Per call of the timed token, through ``CompiledDecode.token`` (its greedy tokens fed back)
    and through its launcher's raw entry alone (both writing their results into two sets of
    buffers in turn where there is a raw entry, as generate does), and through its boxed graph
    alone (inductor's Python wrapper and launcher, nothing of ours): the time before the kernel's
    region starts and after its last barrier (:func:`token_intervals.region_edges`), medians over
    ``rounds`` rounds of NEW - 1 calls each."""
    direct = decode.direct.get(0)
    if len(decode.pieces) != 1 or direct is None or direct.boxed is None:
        print("region edges: the token is not one boxed graph here; not timed")
        return
    names = ("CompiledDecode.token", "raw entry", "boxed graph")
    edges: dict[str, list[tuple[float, float]]] = {name: [] for name in names}

    def timed(name: str, call: Callable[..., Any], *args: Any) -> Any:
        clock.reset()
        called = time.monotonic_ns()
        out = call(*args)
        edges[name].append(region_edges(clock, called, time.monotonic_ns()))
        return out

    positions = range(PROMPT - 1, PROMPT + NEW - 2)
    with torch.inference_mode():
        sets = [decode.output_buffers() for _ in range(2)]  # results in turn, as generate has them
        for _ in range(rounds):
            x = ids[:, -1:]
            for p in positions:
                out = timed("CompiledDecode.token", decode.token, x, p, None, sets[p % 2])
                x = out.greedy[:, None]
            token = [(x, decode.positions[p], decode.zero_state, decode.cache.key_valid,
                      decode.keys[p]) for p in positions]  # fmt: skip
            if direct.raw is not None:
                for p, per_token in zip(positions, token, strict=True):
                    timed("raw entry", direct.raw, direct.token_inputs(per_token), sets[p % 2])
            for per_token in token:
                timed("boxed graph", direct.boxed, direct.boxed_inputs(per_token))
    print("outside the timed token kernel's region, per call (medians):")
    for name, pairs in edges.items():
        if not pairs:
            print(f"  {name:21} not timed (the token has none)")
            continue
        before, after = (1e6 * statistics.median(side) for side in zip(*pairs, strict=True))
        print(f"  {name:21} {before:6.1f} us before the region starts, {after:6.1f} us after "
              f"its last barrier ({len(pairs)} calls)")  # fmt: skip


def token_loop(
    decode: CompiledDecode,
    ids: torch.Tensor,
    argmaxes: int,
    greedy: bool = False,
    reuse: bool = False,
) -> Callable[[], float]:
    """Seconds per token of NEW - 1 compiled tokens with ``argmaxes`` eager greedy argmaxes after
    each (the first fed back as the next input), or with the graph's own ``greedy`` tokens fed
    back; neither: the input stays fixed. ``reuse``: the results written into two sets of
    buffers in turn, the greedy tokens fed back through views made once, as generate does."""

    @torch.inference_mode()
    def run() -> float:
        x = ids[:, -1:]
        sets = [decode.output_buffers() for _ in range(2)] if reuse else [None, None]
        if reuse and None in sets:
            raise RuntimeError("this compiled token has no raw entry to write into buffers")
        views = {s.tensors[-1]: s.tensors[-1][:, None] for s in sets if s is not None}
        t0 = time.perf_counter()
        for position in range(PROMPT - 1, PROMPT + NEW - 2):
            logits, _, chosen = decode.token(x, position, None, sets[position % 2])
            for _ in range(argmaxes):
                token = logits[:, -1].argmax(-1)
            if argmaxes:
                x = token[:, None]
            elif greedy:
                x = views[chosen] if reuse else chosen[:, None]
        return (time.perf_counter() - t0) / (NEW - 1)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--intervals", action="store_true",
                        help="also time a copy whose barriers read a clock (token_intervals)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("small")).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    compiled_generate(model, ids)  # compiles every graph the rounds use
    decode = compiled_token(model, ids)
    unchained = twin_token(model, ids, without_options(inductor_serial_chains.compile_options()))
    pooled_tensors = twin_token(
        model, ids, without_options(inductor_pool_pointers.compile_options())
    )
    asserted = twin_token(model, ids, without_options({"size_asserts": False}))
    wrapped = twin_token(model, ids, without_options(inductor_raw_entry.compile_options()))
    one_chain = twin_token(model, ids, mock.patch.object(functional, "attend", one_value_chain))
    floors, nbytes = floor_calls(model, STEPS)
    clock = BarrierClock(args.threads) if args.intervals else None
    timed = timed_token(model, ids, clock) if clock else None
    methods: dict[str, Callable[[], float]] = {
        "generate(compile=True)": lambda: 1 / compiled_generate(model, ids)[1],
        "graph only": token_loop(decode, ids, 0),
        "graph, unchained": token_loop(unchained, ids, 0),
        "graph, pooled tensors": token_loop(pooled_tensors, ids, 0),
        "graph, size asserts": token_loop(asserted, ids, 0),
        WRAPPED: token_loop(wrapped, ids, 0),
        ONE_CHAIN: token_loop(one_chain, ids, 0),
        **({"graph, timed barriers": token_loop(timed[0], ids, 0)} if timed else {}),
        "graph, greedy fed back": token_loop(decode, ids, 0, greedy=True, reuse=True),
        "graph, greedy, new results": token_loop(decode, ids, 0, greedy=True),
        "graph + argmax": token_loop(decode, ids, 1),
        "+ the same op again": token_loop(decode, ids, 2),
        "products alone": lambda: mean_time(floors["compiled"], NEW - 1),
        "read floor": lambda: mean_time(floors["read"], NEW - 1),
        "torch.sum reads": lambda: mean_time(floors["torch.sum"], NEW - 1),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    order = list(methods)
    if clock:
        clock.reset()  # of the compile's and the first call's barriers
    for _ in range(args.rounds):
        for name in order:
            times[name].append(methods[name]())
        order.reverse()  # drift within a round falls on every method alike over two rounds

    def paired(a: str, b: str) -> float:
        return statistics.median(x - y for x, y in zip(times[a], times[b], strict=True))

    print(f"small preset, r={STEPS}, float32, {args.threads} threads, {nbytes / 1e6:.1f} MB of "
          f"weights per token; {args.rounds} interleaved rounds of {NEW - 1} tokens each")  # fmt: skip
    floor = times["read floor"]
    for name, values in times.items():
        share = statistics.median(f / v for f, v in zip(floor, values, strict=True))
        print(f"{name:24} best {1e6 * min(values):7.1f} us/token, median {1e6 * statistics.median(values):7.1f}; "
              f"read floor / this: best over best {min(floor) / min(values):6.1%}, paired median {share:6.1%}")  # fmt: skip
    print("per token, paired medians:")
    print(f"  products alone - read floor   {1e6 * paired('products alone', 'read floor'):6.1f} us")
    print(f"  torch.sum reads - read floor  {1e6 * paired('torch.sum reads', 'read floor'):6.1f} us (per-op dispatch, torch's full reduction)")  # fmt: skip
    print(f"  graph - products alone        {1e6 * paired('graph only', 'products alone'):6.1f} us (attention, norms, RoPE, synchronisation)")  # fmt: skip
    print(f"  serial loops chained          {1e6 * paired('graph only', 'graph, unchained'):6.1f} us (against one OpenMP barrier per loop)")  # fmt: skip
    print(f"  pool pointers                 {1e6 * paired('graph only', 'graph, pooled tensors'):6.1f} us (against a tensor per pooled intermediate in inductor's entry; the raw entry takes pointers either way)")  # fmt: skip
    print(f"  no launcher size asserts      {1e6 * paired('graph only', 'graph, size asserts'):6.1f} us (against checking every input on each call)")  # fmt: skip
    print(f"  launcher's raw entry          {1e6 * paired('graph only', WRAPPED):6.1f} us (against inductor's entry through its Python wrapper)")  # fmt: skip
    print(f"  grouped values                {1e6 * paired('graph only', ONE_CHAIN):6.1f} us (attention's weighted sum of values in groups of the head dimension, against one chain per output vector)")  # fmt: skip
    print(f"  greedy tokens fed back        {1e6 * paired('graph, greedy, new results', 'graph only'):6.1f} us (the argmax in the graph)")  # fmt: skip
    print(f"  reused result buffers         {1e6 * paired('graph, greedy fed back', 'graph, greedy, new results'):6.1f} us (two sets written in turn, against new result tensors per token)")  # fmt: skip
    print(f"  first op after the graph      {1e6 * paired('graph + argmax', 'graph, greedy, new results'):6.1f} us (an eager argmax instead)")  # fmt: skip
    print(f"  the same op again (warm)      {1e6 * paired('+ the same op again', 'graph + argmax'):6.1f} us")  # fmt: skip
    print(f"  rest of generate's host work  {1e6 * paired('generate(compile=True)', 'graph, greedy fed back'):6.1f} us")  # fmt: skip
    if timed:
        timed_times = times["graph, timed barriers"]
        print(f"  clock reads at the barriers   {1e6 * paired('graph, timed barriers', 'graph only'):6.1f} us")  # fmt: skip
        print_intervals(timed[1], clock, args.rounds * (NEW - 1), statistics.mean(timed_times))
        print_region_edges(timed[0], ids, clock, min(args.rounds, 10))


if __name__ == "__main__":
    main()
