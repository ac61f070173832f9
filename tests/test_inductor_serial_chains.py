"""Serial loops of an inductor CPU kernel chained under one barrier: the regions it writes, the
bits it keeps, and that compiles without the option are untouched."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import compiled_with_code

from recurrent_model import inductor_pool_pointers as pool_pointers
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


def test_a_run_of_serial_loops_is_one_master_chain_with_one_barrier_before_the_next_shared_loop(
    monkeypatch,
):
    calls = [("parallel", 2), ("single",), ("single",), ("parallel", 2), ("single",), ("close",)]
    assert _regions(calls, True, monkeypatch) == [
        "#pragma omp parallel num_threads(2)",
        "#pragma omp master",
        "#pragma omp master",
        "#pragma omp barrier",
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


def test_no_barrier_where_a_new_region_starts_or_outside_any_region(monkeypatch):
    calls = [("single",), ("parallel", 2), ("single",), ("parallel", 4), ("close",)]
    assert _regions(calls, True, monkeypatch) == [
        "#pragma omp parallel num_threads(2)",
        "#pragma omp master",
        "}",
        "#pragma omp parallel num_threads(4)",
        "}",
    ]


def test_an_unchecked_torch_gets_no_option_and_no_code_generator(monkeypatch):
    monkeypatch.setattr(chains, "torch_release", lambda: (9, 9))
    monkeypatch.setattr(pool_pointers, "torch_release", lambda: (9, 9))
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
    pragmas = re.findall(r"#pragma omp (\w+)", chained_code)
    assert "single" not in pragmas and pragmas.count("master") >= 2
    for before, after in zip(pragmas, pragmas[1:], strict=False):
        assert (before, after) != ("master", "for"), "a shared loop read a chain before a barrier"
    assert ("master", "master") in zip(pragmas, pragmas[1:], strict=False)
    assert ("master", "barrier") in zip(pragmas, pragmas[1:], strict=False)
