"""Serial loops of an inductor CPU kernel chained under one barrier: the regions it writes, the
bits it keeps, and that compiles without the option are untouched."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import compiled_with_code

from recurrent_model import inductor_pool_pointers as pool_pointers
from recurrent_model import inductor_raw_entry as raw_entry
from recurrent_model import inductor_serial_chains as chains
from recurrent_model.compiled import CPU_OPTIONS, cpu_options
from recurrent_model.inductor_isa import isa_options


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def writeline(self, line: str) -> None:
        self.lines.append(line)


class _InductorLikeWorkSharing:
    """The part of inductor's WorkSharing the chaining subclass builds on."""

    def __init__(self, code: _Lines) -> None:
        self.code, self.in_parallel, self.num_threads = code, False, None

    def parallel(self, threads: int) -> None:
        if self.in_parallel and threads != self.num_threads:
            self.close()
        if not self.in_parallel:
            self.in_parallel, self.num_threads = True, threads
            self.code.writeline(f"#pragma omp parallel num_threads({threads})")

    def single(self) -> bool:
        if self.in_parallel:
            self.code.writeline("#pragma omp single")
        return self.in_parallel

    def close(self) -> None:
        if self.in_parallel:
            self.code.writeline("}")
        self.in_parallel = False


def _regions(calls: list[tuple], chaining: bool, monkeypatch) -> list[str]:
    monkeypatch.setattr(chains, "_chaining", lambda: chaining)
    code = _Lines()
    sharing = chains._chained_work_sharing(_InductorLikeWorkSharing)(code)
    for name, *args in calls:
        getattr(sharing, name)(*args)
    return code.lines


def _declaration(region: int, threads: int) -> list[str]:
    return chains.BARRIER.format(n=region, spins=chains.SPINS, threads=threads).splitlines()


def test_a_run_of_serial_loops_is_one_master_chain_with_one_barrier_before_the_next_shared_loop(
    monkeypatch,
):
    calls = [("parallel", 2), ("single",), ("single",), ("parallel", 2), ("single",), ("close",)]
    assert _regions(calls, True, monkeypatch) == [
        *_declaration(0, 2),
        "#pragma omp parallel num_threads(2)",
        "barrier_0();",  # the shared loop's results, before thread 0 reads them
        "#pragma omp master",
        "#pragma omp master",
        "barrier_0();",
        "barrier_0();",
        "#pragma omp master",
        "}",  # the region's end is the chain's barrier
    ]
    assert _regions(calls, False, monkeypatch) == [
        "#pragma omp parallel num_threads(2)",
        "#pragma omp single",
        "#pragma omp single",
        "#pragma omp single",
        "}",
    ]


def test_each_region_declares_its_own_barrier_and_none_is_written_outside_a_region(monkeypatch):
    assert "barrier_phase_1_t barrier_phases_1[4];" in _declaration(1, 4)  # a count per thread
    calls = [("single",), ("parallel", 2), ("single",), ("parallel", 4), ("parallel", 4),
             ("close",)]  # fmt: skip
    assert _regions(calls, True, monkeypatch) == [
        *_declaration(0, 2),
        "#pragma omp parallel num_threads(2)",
        "barrier_0();",
        "#pragma omp master",
        "}",
        *_declaration(1, 4),  # one phase count per thread of the region
        "#pragma omp parallel num_threads(4)",
        "barrier_1();",
        "}",
    ]


class _Loop:
    def __init__(self, parallel: int, lines: list[str]) -> None:
        self.parallel, self.out = parallel, lines


def test_only_shared_loops_of_a_chaining_compile_end_without_their_barrier(monkeypatch):
    lines = chains._shared_loop_lines(lambda loop: loop.out)
    shared = _Loop(1, ["#pragma omp for collapse(2)", "for(...)"])
    serial = _Loop(0, ["#pragma GCC ivdep", "for(...)"])
    monkeypatch.setattr(chains, "_chaining", lambda: True)
    assert lines(shared) == ["#pragma omp for collapse(2) nowait", "for(...)"]
    assert lines(serial) == serial.out
    assert lines(_Loop(1, ["for(...)"])) == ["for(...)"]  # a collapsed inner loop
    monkeypatch.setattr(chains, "_chaining", lambda: False)
    assert lines(shared) == shared.out


def test_with_the_cpp_launcher_a_chaining_compile_never_splits_a_kernel_by_its_arguments(
    monkeypatch,
):
    from torch._inductor import config

    count = chains._unsplit_kernels(lambda scheduling: 501)  # past inductor's 500
    for chaining, cpp_wrapper, counted in [(True, True, 0), (True, False, 501), (False, True, 501)]:
        monkeypatch.setattr(chains, "_chaining", lambda chaining=chaining: chaining)
        with config.patch(cpp_wrapper=cpp_wrapper):
            assert count(None) == counted, (chaining, cpp_wrapper)


def test_an_unchecked_torch_gets_no_option_and_no_code_generator(monkeypatch):
    monkeypatch.setattr(chains, "torch_release", lambda: (9, 9))
    monkeypatch.setattr(pool_pointers, "torch_release", lambda: (9, 9))
    monkeypatch.setattr(raw_entry, "torch_release", lambda: (9, 9))
    assert not chains.install()
    assert cpu_options() == {**CPU_OPTIONS, **isa_options()}


def _norm_between_products(x, w1, w2, g):
    h = (x[None, :] * w1).sum(-1)  # shared between the threads: one row each
    h = h * torch.rsqrt(h.pow(2).mean() + 1e-6) * g  # serial: too few values to split
    h = h * torch.rsqrt(h.pow(2).mean() + 1e-6)
    return (h[None, :] * w2).sum(-1)


@pytest.mark.skipif(not chains.supported(), reason="chained regions are for checked torch releases")
def test_a_compiled_kernel_chains_its_serial_loops_and_computes_the_same_bits():
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(1024, generator=g), torch.randn(256, 1024, generator=g),
              torch.randn(2048, 256, generator=g), torch.randn(256, generator=g))  # fmt: skip
    plain, plain_code = compiled_with_code(
        _norm_between_products, dict(CPU_OPTIONS), inputs, threads=2
    )
    chained, chained_code = compiled_with_code(
        _norm_between_products, cpu_options(), inputs, threads=2
    )
    assert torch.equal(chained, plain)
    assert "#pragma omp single" in plain_code and "#pragma omp master" not in plain_code
    assert "single" not in re.findall(r"#pragma omp (\w+)", chained_code)
    assert "#pragma omp barrier" not in chained_code and "#pragma omp for nowait" in chained_code
    events = re.findall(r"#pragma omp (parallel|for|master)|\b(barrier)_\d+\(\);", chained_code)
    events = [pragma or call for pragma, call in events]
    pairs = list(zip(events, events[1:], strict=False))
    assert events.count("master") >= 2 and ("master", "master") in pairs
    unsynced = None  # what ran since the threads last waited for each other
    for event in events:
        if event == "for":
            assert unsynced is None, f"a shared loop started after a {unsynced} without a barrier"
        if event == "master":
            assert unsynced != "for", "a chain read a shared loop's results without a barrier"
        unsynced = None if event in ("parallel", "barrier") else event


def _activation_between_products(x, w1, w2):
    from recurrent_model import functional as fn

    gate, up = fn.linear(x, w1).chunk(2, -1)  # shared between the threads: rows split
    return fn.linear(torch.nn.functional.silu(gate) * up, w2)


def test_an_activation_between_two_products_is_split_between_the_threads():
    # 704 values between two shared loops: inductor's default (512 per thread) runs them on one
    # thread while the other waits at the next barrier; CPU_OPTIONS' smaller chunk splits them,
    # without an extra barrier and with the same bits.
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(1, 1, 256, generator=g), torch.randn(1408, 256, generator=g),
              torch.randn(256, 704, generator=g))  # fmt: skip
    assert cpu_options()["cpp.min_chunk_size"] == CPU_OPTIONS["cpp.min_chunk_size"] < 512
    whole, whole_code = compiled_with_code(
        _activation_between_products, {**cpu_options(), "cpp.min_chunk_size": 512}, inputs, 2
    )
    split, split_code = compiled_with_code(_activation_between_products, cpu_options(), inputs, 2)
    assert torch.equal(split, whole)
    one_thread = re.compile(r"#pragma omp (?:single|master)")
    assert len(one_thread.findall(split_code)) < len(one_thread.findall(whole_code))
    shared = re.compile(r"#pragma omp for")
    assert len(shared.findall(split_code)) == len(shared.findall(whole_code)) + 1
    barriers = re.compile(r"\bbarrier_\d+\(\);|#pragma omp barrier")
    assert len(barriers.findall(split_code)) <= len(barriers.findall(whole_code))
