"""Consecutive serial loops of an inductor CPU kernel run as one chain, and the kernel's threads
wait for each other at barriers of its own.

Inductor's C++ backend fuses a decode token into one OpenMP parallel region per kernel. Each
loop too small to split between threads (a norm over ``n_embd`` values, RoPE on one token, a cache
write) becomes ``#pragma omp single``, which ends in a barrier, and one token of the small preset
runs about 170 of them, most in runs of two or three. Each barrier waits for the slower thread, so
on cores shared with other work a thread descheduled anywhere in the token stalls the other at the
next barrier; on idle cores a barrier costs about as much as the small loop before it. And each of
OpenMP's barriers (libgomp's) ends in a ``futex`` wake system call by the last thread to arrive,
whether or not another thread sleeps: about 200 system calls per token.

With :func:`serial_chains` among a compile's inductor options:

- each serial loop becomes ``#pragma omp master`` (thread 0, no barrier); thread 0 runs a chain's
  loops in program order;
- each loop the threads share ends without OpenMP's barrier (``#pragma omp for nowait``);
- before whatever next runs in the region after a shared loop or a chain (a shared loop, or a
  chain after a shared loop), the threads meet at the region's own barrier (``BARRIER``): a
  phase count per thread, each bumped by its thread and read by the others, which spin in user
  space (yielding the core after ``SPINS`` rounds); the end of the parallel region is OpenMP's
  barrier still.

Every write before a barrier is visible to every thread after it (the counts' release stores and
acquire loads), each loop computes what it computed before: the same bits. And with the C++
launcher, a kernel is not split at ``MAX_FUSED_KERNEL_ARGS_NUM`` arguments (a limit for ctypes,
which only a Python launcher uses): a small-preset token is one kernel, one parallel region,
instead of two.

The option is a post-grad pass that leaves the graph unchanged. Inductor keys its graph cache by
the pass's :meth:`uuid`, so a chained kernel and an unchained one of the same graph never share a
cache entry; the code generator reads the option while it writes the kernel, so compiles without
it (a user's own ``torch.compile``) are untouched. :func:`install` puts the code generator in place
once per process, on the torch releases whose ``WorkSharing``, ``LoopLevel`` and ``CppScheduling``
it was written against; elsewhere :func:`compile_options` adds nothing and the kernels keep
inductor's own regions.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .inductor_marks import mark
from .torch_release import torch_release

#: torch releases whose inductor ``WorkSharing`` (``parallel``/``single``/``close``, one per
#: kernel group), ``LoopLevel.lines`` (a loop's pragma) and ``CppScheduling`` (a kernel split at
#: ``MAX_FUSED_KERNEL_ARGS_NUM`` arguments) this module's code was checked against.
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


#: C++ of one region's barrier, declared before the region (``{n}``: the region's number,
#: ``{threads}``: its thread count): one phase count per thread, each on a cache line of its own;
#: a thread arriving bumps its own count (a release store) and spins until every other thread's
#: count has reached it (acquire loads), pausing, and after ``SPINS`` rounds yields the core on
#: every round (a descheduled thread gets its core back). A thread is at most one barrier ahead of
#: another, so a count past the phase releases as well. With two threads each arrival is one store
#: to a line its thread holds and one line read from the other, where a shared arrival counter
#: would also move that counter's line to the last thread to arrive.
BARRIER = """\
struct alignas(64) barrier_phase_{n}_t {{ std::atomic<int> count{{0}}; }};
barrier_phase_{n}_t barrier_phases_{n}[{threads}];
auto barrier_{n} = [&barrier_phases_{n}]() {{
    const int thread = omp_get_thread_num();
    const int threads = omp_get_num_threads();
    const int phase = barrier_phases_{n}[thread].count.load(std::memory_order_relaxed) + 1;
    barrier_phases_{n}[thread].count.store(phase, std::memory_order_release);
    for (int other = 0; other < threads; ++other) {{
        if (other == thread) continue;
        for (int spins = 0; barrier_phases_{n}[other].count.load(std::memory_order_acquire) < phase;
             ++spins) {{
            if (spins >= {spins}) {{ sched_yield(); continue; }}
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ __volatile__("yield");
#endif
        }}
    }}
}};"""
SPINS = 1 << 12


def _chained_work_sharing(base: type) -> type:
    """A subclass of inductor's ``WorkSharing`` that, when :func:`_chaining`, writes serial loops
    as chains of master regions, ends shared loops without OpenMP's barrier (``nowait``, see
    :func:`_shared_loop_lines`) and writes each barrier the threads need as a call of the
    region's own spinning barrier (``BARRIER``); inductor's own regions otherwise."""

    class ChainedWorkSharing(base):  # type: ignore[misc, valid-type]
        #: what ran since the last barrier: "master" (a serial chain), "shared" (a loop shared
        #: without its own barrier) or None
        unsynced: str | None = None
        region = -1  # the last region opened

        def barrier(self) -> None:
            self.code.writeline(f"barrier_{self.region}();")

        def parallel(self, threads: int) -> None:
            if not _chaining():
                return super().parallel(threads)
            if self.in_parallel and threads == self.num_threads:
                if self.unsynced:
                    self.barrier()
            else:
                self.close()
                self.region += 1  # one kernel's regions: 0, 1, …
                for line in BARRIER.format(
                    n=self.region, spins=SPINS, threads=threads
                ).splitlines():
                    self.code.writeline(line)
            super().parallel(threads)
            self.unsynced = "shared"

        def single(self) -> bool:
            if not (self.in_parallel and _chaining()):
                return super().single()
            if self.unsynced == "shared":
                self.barrier()
            self.code.writeline("#pragma omp master")
            self.unsynced = "master"
            return True

        def close(self) -> None:
            self.unsynced = None  # a parallel region ends in a barrier
            super().close()

    ChainedWorkSharing.__qualname__ = ChainedWorkSharing.__name__ = "ChainedWorkSharing"
    return ChainedWorkSharing


def supported() -> bool:
    """Whether this torch's inductor is one the chained regions were checked against, on a
    compiler with POSIX threads (the barrier yields with ``sched_yield``)."""
    return torch_release() in CHECKED_TORCH and sys.platform != "win32"


def _shared_loop_lines(lines: Any) -> Any:
    """``LoopLevel.lines`` that, when :func:`_chaining`, ends a loop shared between the threads
    without OpenMP's barrier (``nowait``): the work sharing writes the region's own barrier before
    whatever runs next in the region (or the region's end waits)."""

    @functools.wraps(lines)
    def shared_loop_lines(self: Any) -> Any:
        out = lines(self)
        if out and self.parallel and _chaining() and out[0].startswith("#pragma omp for"):
            out = [f"{out[0]} nowait", *out[1:]]
        return out

    shared_loop_lines.ends_shared_loops_nowait = True
    return shared_loop_lines


def _unsplit_kernels(count_args: Any) -> Any:
    """``CppScheduling._get_scheduled_num_args`` that, when :func:`_chaining` with the C++
    launcher (``cpp_wrapper``), counts no arguments: inductor starts a new kernel (and a new
    parallel region) past ``MAX_FUSED_KERNEL_ARGS_NUM`` arguments, the limit of ctypes, which calls
    a kernel from a Python launcher only; a C++ launcher calls it directly."""

    @functools.wraps(count_args)
    def scheduled_num_args(self: Any) -> Any:
        from torch._inductor import config

        return 0 if _chaining() and config.cpp_wrapper else count_args(self)

    scheduled_num_args.keeps_kernels_whole = True
    return scheduled_num_args


def install() -> bool:
    """Put the chaining ``WorkSharing``, the shared loops without their barrier and the kernels
    unsplit by their argument count into inductor's C++ code generator (once); False where this
    torch is not a checked release (nothing is changed)."""
    if not supported():
        return False
    from torch._inductor.codegen import cpp

    if not getattr(cpp.WorkSharing, "chains_serial_regions", False):
        chained = _chained_work_sharing(cpp.WorkSharing)
        chained.chains_serial_regions = True
        cpp.WorkSharing = chained
    if not getattr(cpp.LoopLevel.lines, "ends_shared_loops_nowait", False):
        cpp.LoopLevel.lines = _shared_loop_lines(cpp.LoopLevel.lines)
    count_args = cpp.CppScheduling._get_scheduled_num_args
    if not getattr(count_args, "keeps_kernels_whole", False):
        cpp.CppScheduling._get_scheduled_num_args = _unsplit_kernels(count_args)
    return True


def compile_options() -> dict[str, Any]:
    """The inductor option that chains serial regions, with the code generator installed; empty
    where this torch is not a checked release."""
    return {"post_grad_custom_post_pass": serial_chains()} if install() else {}
