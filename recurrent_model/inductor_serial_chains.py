"""Consecutive serial loops of an inductor CPU kernel run as one chain, with one barrier after it.

Inductor's C++ backend fuses a whole decode token into one OpenMP parallel region. Each loop too
small to split between threads (a norm over ``n_embd`` values, RoPE on one token, a cache write)
becomes ``#pragma omp single``, which ends in a barrier, and one token of the small preset runs
about 170 of them, most in runs of two or three. Each barrier waits for the slower thread, so on
cores shared with other work a thread descheduled anywhere in the token stalls the other at the
next barrier; on idle cores a barrier costs about as much as the small loop before it.

With :func:`serial_chains` among a compile's inductor options, each such loop becomes
``#pragma omp master`` (thread 0, no barrier), and one ``#pragma omp barrier`` precedes the next
loop that the threads share; the end of the parallel region is a barrier already. Thread 0 runs a
chain's loops in program order, the barrier makes their writes visible to every thread before any
reads them, and each loop computes what it computed before: the same bits.

The option is a post-grad pass that leaves the graph unchanged. Inductor keys its graph cache by
the pass's :meth:`uuid`, so a chained kernel and an unchained one of the same graph never share a
cache entry; the code generator reads the option while it writes the kernel, so compiles without
it (a user's own ``torch.compile``) are untouched. :func:`install` puts the code generator in place
once per process, on the torch releases whose ``WorkSharing`` it was written against; elsewhere
:func:`compile_options` adds nothing and the kernels keep inductor's own regions.
"""

from __future__ import annotations

import functools
from typing import Any

from .inductor_marks import mark
from .torch_release import torch_release

#: torch releases whose inductor ``WorkSharing`` (``parallel``/``single``/``close``, one per
#: kernel group) this module's subclass was checked against.
CHECKED_TORCH = ((2, 13),)


@functools.cache
def serial_chains() -> Any:
    """The option's value: a post-grad pass that changes nothing, present to select chained serial
    regions and to key inductor's cache by this module's source (:func:`inductor_marks.mark`)."""
    return mark("SerialChains", __file__)


def _chaining() -> bool:
    """Whether the kernel being written belongs to a compile with :func:`serial_chains`."""
    from torch._inductor import config

    return type(config.post_grad_custom_post_pass) is type(serial_chains())  # copies count too


def _chained_work_sharing(base: type) -> type:
    """A subclass of inductor's ``WorkSharing`` that writes serial loops as chains of master
    regions when :func:`_chaining`, and inductor's own regions otherwise."""

    class ChainedWorkSharing(base):  # type: ignore[misc, valid-type]
        unshared_writes = False  # thread 0 ran a master region since the last barrier

        def parallel(self, threads: int) -> None:
            if self.in_parallel and threads == self.num_threads and self.unshared_writes:
                self.code.writeline("#pragma omp barrier")
            self.unshared_writes = False
            super().parallel(threads)

        def single(self) -> bool:
            if not (self.in_parallel and _chaining()):
                return super().single()
            self.code.writeline("#pragma omp master")
            self.unshared_writes = True
            return True

        def close(self) -> None:
            self.unshared_writes = False  # a parallel region ends in a barrier
            super().close()

    ChainedWorkSharing.__qualname__ = ChainedWorkSharing.__name__ = "ChainedWorkSharing"
    return ChainedWorkSharing


def supported() -> bool:
    """Whether this torch's inductor is one the chained regions were checked against."""
    return torch_release() in CHECKED_TORCH


def install() -> bool:
    """Put the chaining ``WorkSharing`` into inductor's C++ code generator (once); False where
    this torch is not a checked release (nothing is changed)."""
    if not supported():
        return False
    from torch._inductor.codegen import cpp

    if not getattr(cpp.WorkSharing, "chains_serial_regions", False):
        chained = _chained_work_sharing(cpp.WorkSharing)
        chained.chains_serial_regions = True
        cpp.WorkSharing = chained
    return True


def compile_options() -> dict[str, Any]:
    """The inductor option that chains serial regions, with the code generator installed; empty
    where this torch is not a checked release."""
    return {"post_grad_custom_post_pass": serial_chains()} if install() else {}
