"""bench/token_intervals.py: a kernel compiled with timed barriers computes the same bits, fills one
clock entry per barrier call, names each by what ran before it, and leaves no timed kernel for a
later compile to load."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from recurrent_model import compiled, inductor_serial_chains

BENCH = Path(__file__).resolve().parent.parent / "bench" / "token_intervals.py"

pytestmark = pytest.mark.skipif(
    not inductor_serial_chains.supported(), reason="no chained regions on this torch"
)


@pytest.fixture(scope="module")
def intervals():
    spec = importlib.util.spec_from_file_location("token_intervals", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


#: every clock a timed kernel of this process was compiled with, alive as long as the process
KEPT: list = []


def timed_fn(x, w1, w2, keys):
    """A product, a serial norm, a product and a softmax over a dynamic length."""
    h = (w1 * x).sum(1)
    h = h * torch.rsqrt(h.pow(2).mean() + 1e-6)
    scores = (keys * h[:64]).sum(1).softmax(0)
    return (w2 * h).sum(1), scores


def plain_fn(x, w1, w2, keys):
    """timed_fn, as its own code object, so dynamo compiles it apart."""
    h = (w1 * x).sum(1)
    h = h * torch.rsqrt(h.pow(2).mean() + 1e-6)
    scores = (keys * h[:64]).sum(1).softmax(0)
    return (w2 * h).sum(1), scores


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread: no parallel region to time")
def test_timed_kernel_splits_by_what_ran_and_leaves_no_trace(intervals):
    torch.manual_seed(0)
    args = (torch.randn(256), torch.randn(512, 256), torch.randn(512, 512), torch.randn(40, 64))
    torch._dynamo.mark_dynamic(args[3], 0)
    threads = torch.get_num_threads()
    clock = intervals.BarrierClock(threads)
    KEPT.append(clock)  # the timed kernel, in dynamo's cache for timed_fn, writes to its table
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with intervals.timed_compile(clock):
        timed = torch.compile(timed_fn, options=compiled.cpu_options())
        out, (source,) = run_and_get_code(timed, *args)
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] != cache  # a directory of its own
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == cache
    assert not torch.compiler.config.force_disable_caches

    kinds = intervals.barrier_kinds(source)
    assert kinds[:4] == ["product", "chain", "product", "attention"]
    assert len(kinds) == 5  # and one more at the region's end: the last shared loop's tail
    clock.reset()
    calls = 4
    for _ in range(calls):
        timed(*args)
    assert clock.used() == len(kinds)
    parts = intervals.split(source, clock, calls)
    assert parts.count == {"product": 2, "attention": 1, "pointwise": 0, "chain": 2}
    for kind in intervals.KINDS:
        assert min(parts.work[kind] + parts.wait[kind]) >= 0
    assert parts.work["product"][0] > 0 and parts.work["chain"][0] > 0
    if threads > 1:
        assert parts.work["product"][1] > 0  # the other threads share the products
    clock.reset()  # one call: its region lies within the call, whatever the edges take
    called = time.monotonic_ns()
    timed(*args)
    returned = time.monotonic_ns()
    before, after = intervals.region_edges(clock, called, returned)
    in_region = int(clock.table[0].sum()) / 1e9
    assert before > 0 and after > 0 and in_region > 0
    assert before + in_region + after == pytest.approx((returned - called) / 1e9, abs=1e-9)

    plain = torch.compile(plain_fn, options=compiled.cpu_options())
    reference, (plain_source,) = run_and_get_code(plain, *args)
    assert "barrier_clock" in source and "barrier_clock" not in plain_source
    assert intervals.barrier_kinds(plain_source) == kinds[:4]
    for a, b in zip(out, reference, strict=True):
        assert torch.equal(a, b)  # the clock reads change no bits


def test_region_edges_are_the_call_less_thread_0s_back_to_back_intervals(intervals):
    clock = intervals.BarrierClock(2, barriers=4)
    clock.table[0, :2] = torch.tensor([[100, 20], [50, 30]])  # ns of work and wait per barrier
    clock.table[1, :2] = 7  # the other thread's intervals do not count
    clock.state[0, 1] = 10_000  # thread 0's last release
    before, after = intervals.region_edges(clock, called=9_000, returned=10_500)
    assert (before, after) == pytest.approx((800e-9, 500e-9))  # started at 10_000 - 200


def test_a_source_of_another_kernel_is_refused(intervals):
    clock = intervals.BarrierClock(2, barriers=8)
    clock.table[0, :3, 0] = 1
    source = "#pragma omp parallel\n{ barrier_0();\n #pragma omp for nowait\n barrier_0(); }"
    with pytest.raises(RuntimeError, match="2 barrier calls, its clock 3"):
        intervals.split(source, clock, 1)


def test_a_barrier_it_cannot_wrap_is_refused(intervals):
    with pytest.raises(RuntimeError, match="declares no 'auto barrier_"):
        intervals.BarrierClock(2).template("auto other_{n} = [](){{}};")


def test_barriers_are_named_by_the_loops_before_them(intervals):
    shared = "#pragma omp for nowait\nfor(int64_t x0=0; x0<static_cast<int64_t>({n}); ++x0)\n"
    product = shared.format(n="352L") + "{ float tmp_acc0 = 0; tmp_acc0 += w[x0] * x[x0]; }\n"
    attention = shared.format(n="ks0") + "{ float tmp_acc0 = 0; }\n"
    pointwise = shared.format(n="704L") + "{ out[x0] = in[x0] / (1 + exp(-in[x0])); }\n"
    chain = "#pragma omp master\n{ float tmp_acc0 = 0; }\n"
    pieces = [product, chain, attention, pointwise + product, pointwise, chain + chain]
    source = "void kernel() {\n#pragma omp parallel num_threads(2)\n{\n"
    source += "".join(piece + "barrier_0();\n" for piece in pieces) + "}\n}\n"
    assert intervals.barrier_kinds(source) == [
        "product",
        "chain",
        "attention",
        "product",
        "pointwise",
        "chain",
    ]


def test_products_are_split_by_what_ran_before_them(intervals):
    kinds = ["product", "chain", "product", "attention", "product", "pointwise", "product"]
    assert intervals.products_by_predecessor(kinds) == [
        "product",
        "chain",
        "product after chain",
        "attention",
        "product after attention",
        "pointwise",
        "product after pointwise",
    ]
    product = "#pragma omp for nowait\nfor(int64_t x0=0; x0<static_cast<int64_t>(64L); ++x0)\n"
    product += "{ float tmp_acc0 = 0; }\n"
    chain = "#pragma omp master\n{ float tmp_acc0 = 0; }\n"
    pieces = [product, chain, product, chain, product]
    source = "void kernel() {\n#pragma omp parallel num_threads(2)\n{\n"
    source += "".join(piece + "barrier_0();\n" for piece in pieces) + "}\n}\n"
    names = intervals.products_by_predecessor(intervals.barrier_kinds(source))
    clock = intervals.BarrierClock(2, barriers=8)
    clock.table[0, :5, 0] = torch.tensor([10, 20, 30, 40, 50])  # ns of work per barrier, thread 0
    clock.table[1, :5, 1] = torch.tensor([1, 2, 3, 4, 5])  # ns of wait, the other thread
    parts = intervals.split(source, clock, 2, names)
    assert parts.count == {"product": 1, "chain": 2, "product after chain": 2}
    assert parts.work["product after chain"] == pytest.approx(((30 + 50) / 2e9, 0.0))
    assert parts.wait["product after chain"] == pytest.approx((0.0, (3 + 5) / 2e9))
    assert parts.work["chain"] == pytest.approx(((20 + 40) / 2e9, 0.0))
    with pytest.raises(RuntimeError, match="4 names for the kernel's 5 barrier calls"):
        intervals.split(source, clock, 2, names[:4])
