"""A compiled decode token's time split by what its kernel ran between barriers, read from the
kernel's own clock.

:class:`BarrierClock` wraps the barrier of ``inductor_serial_chains`` (``BARRIER``, called
unchanged) in one that reads a steady clock when a thread arrives and when it is released, and adds
to ``table[thread, k]`` the time the thread worked since its last release and the time it waited at
its ``k``-th barrier of the kernel call. :func:`timed_compile` compiles with it; :func:`split` names
each barrier by what the kernel ran before it (a serial chain on thread 0, attention over the key
count, a product, a shared pointwise loop) and sums the table per name.

No sampling profiler is needed, and none would do on a VM: a timer sample of a thread spinning at a
barrier lands where the guest resumes, not where the time went. The table's address is written into
the kernel's source, so that kernel must never be loaded by another process: it is compiled with
inductor's caches off, its files in a temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from recurrent_model import inductor_serial_chains

#: C++ of the timed barrier: the shipped one renamed ``barrier_untimed_{n}``, then the clock reads
#: around its call; ``@CLOCK@``/``@STATE@``/``@THREADS@``/``@BARRIERS@`` are filled per table.
TIMED = """\
auto barrier_now_{n} = []() -> int64_t {{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}};
auto* barrier_clock_{n} = reinterpret_cast<int64_t*>(@CLOCK@ULL);
auto* barrier_state_{n} = reinterpret_cast<int64_t*>(@STATE@ULL);
if ({n} == 0) {{
    for (int t = 0; t < @THREADS@; ++t) {{
        barrier_state_{n}[2 * t] = 0;
        barrier_state_{n}[2 * t + 1] = barrier_now_{n}();
    }}
}}
auto barrier_{n} = [&]() {{
    const int t = omp_get_thread_num();
    const int64_t arrived = barrier_now_{n}();
    barrier_untimed_{n}();
    const int64_t released = barrier_now_{n}();
    if (t >= @THREADS@) return;
    const int64_t k = barrier_state_{n}[2 * t]++;
    if (k >= @BARRIERS@) return;
    barrier_clock_{n}[2 * (t * @BARRIERS@ + k)] += arrived - barrier_state_{n}[2 * t + 1];
    barrier_clock_{n}[2 * (t * @BARRIERS@ + k) + 1] += released - arrived;
    barrier_state_{n}[2 * t + 1] = released;
}};"""


class BarrierClock:
    """The table the timed barriers add to: nanoseconds ``[thread, barrier, (work, wait)]``. A kernel
    compiled with it writes to its tensors: keep it alive as long as such a kernel may run."""

    def __init__(self, threads: int, barriers: int = 4096) -> None:
        self.table = torch.zeros(threads, barriers, 2, dtype=torch.int64)
        self.state = torch.zeros(threads, 2, dtype=torch.int64)  # next barrier, last release

    def reset(self) -> None:
        self.table.zero_()

    def used(self) -> int:
        """How many barriers of a kernel call thread 0 passed (entries with any time)."""
        return int((self.table[0].sum(1) > 0).sum())

    def template(self, barrier: str) -> str:
        """``barrier`` (inductor_serial_chains' template) renamed and wrapped in the clock reads."""
        untimed = barrier.replace("auto barrier_{n} =", "auto barrier_untimed_{n} =")
        if untimed == barrier:
            raise RuntimeError("inductor_serial_chains.BARRIER declares no 'auto barrier_{n} =': "
                               "the timed barrier cannot wrap it")  # fmt: skip
        fills = {"@CLOCK@": self.table.data_ptr(), "@STATE@": self.state.data_ptr(),
                 "@THREADS@": self.table.shape[0], "@BARRIERS@": self.table.shape[1]}  # fmt: skip
        timed = TIMED
        for key, value in fills.items():
            timed = timed.replace(key, str(value))
        return f"{untimed}\n{timed}"


def _closing_barrier(close: Callable[..., Any]) -> Callable[..., Any]:
    """``WorkSharing.close`` (or ``__exit__``, which ends a kernel's last region) that first ends a
    chained region with a call of its own barrier, so that what runs after the region's last
    barrier is timed too (the region's end waits anyway)."""

    def close_timed(self: Any, *args: Any) -> Any:
        if self.in_parallel and inductor_serial_chains._chaining():
            self.barrier()
        return close(self, *args)

    return close_timed


@contextlib.contextmanager
def timed_compile(clock: BarrierClock) -> Iterator[None]:
    """Compiles inside run with timed barriers (one more at each region's end), inductor's caches
    off and its files in a temporary directory (the kernel's source holds this process's
    addresses)."""
    if not inductor_serial_chains.install():
        raise RuntimeError("the timed barriers wrap inductor_serial_chains' barrier, which this "
                           f"torch ({torch.__version__}) does not use")  # fmt: skip
    from torch._inductor.codegen import cpp

    template = clock.template(inductor_serial_chains.BARRIER)
    with (
        tempfile.TemporaryDirectory(prefix="timed_barriers_") as cache,
        mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}),
        torch.compiler.config.patch(force_disable_caches=True),
        mock.patch.object(inductor_serial_chains, "BARRIER", template),
        mock.patch.object(cpp.WorkSharing, "close", _closing_barrier(cpp.WorkSharing.close)),
        mock.patch.object(cpp.WorkSharing, "__exit__", _closing_barrier(cpp.WorkSharing.__exit__)),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")  # said above
        yield


def region_edges(clock: BarrierClock, called: int, returned: int) -> tuple[float, float]:
    """Seconds of one kernel call outside its parallel region: before the region started and after
    thread 0's last barrier, from the steady-clock times (``time.monotonic_ns``) at which the call
    was made and returned and the clock's table of that call alone (reset before it). Thread 0's
    intervals run back to back from the region's start to its last release, so the region started
    at that release less their sum."""
    last_release = int(clock.state[0, 1])
    started = last_release - int(clock.table[0].sum())
    return (started - called) / 1e9, (returned - last_release) / 1e9


#: what a kernel ran between two barriers, by its source
KINDS = ("product", "attention", "pointwise", "chain")


def barrier_kinds(source: str) -> list[str]:
    """For each barrier call of the kernel in ``source``, in order, what ran since the last one:
    ``chain`` (serial loops only: thread 0), ``attention`` (a loop shared between the threads over
    the graph's dynamic size, the key count), ``product`` (other shared loops that reduce: the
    row sums) or ``pointwise`` (shared loops without a reduction, such as an MLP's activation)."""
    start = source.find("#pragma omp parallel")
    pieces = re.split(r"\bbarrier_\d+\(\);", source[start:])[:-1]  # the last: after the region
    kinds = []
    for piece in pieces:
        if "#pragma omp for" not in piece:
            kinds.append("chain")
        elif re.search(r"<static_cast<int64_t>\(ks\d+\)", piece):
            kinds.append("attention")
        elif "tmp_acc" in piece:
            kinds.append("product")
        else:
            kinds.append("pointwise")
    return kinds


@dataclass
class Split:
    """Seconds per kernel call, per kind of interval, of thread 0 and of the others (their mean)."""

    count: dict[str, int]
    work: dict[str, tuple[float, float]]
    wait: dict[str, tuple[float, float]]


def products_by_predecessor(kinds: list[str]) -> list[str]:
    """``kinds`` (:func:`barrier_kinds`) with each product named by what ran before it, e.g.
    "product after chain": after a serial chain thread 0 starts the product with the chain's output
    in its own cache and the others on their release from a barrier they waited at, after a shared
    loop every thread starts from its own part."""
    return [
        f"{kind} after {kinds[i - 1]}" if kind == "product" and i else kind
        for i, kind in enumerate(kinds)
    ]


def split(source: str, clock: BarrierClock, calls: int, names: list[str] | None = None) -> Split:
    """The clock's table, per kernel call, summed per name of each barrier call: ``names`` (one per
    call, in order), by default :func:`barrier_kinds` of ``source`` (every kind of ``KINDS`` a key,
    present or not)."""
    kinds = barrier_kinds(source)
    if clock.used() != len(kinds):
        raise RuntimeError(f"the kernel's source has {len(kinds)} barrier calls, its clock "
                           f"{clock.used()}: not the kernel that ran, or several kernels")  # fmt: skip
    if names is not None and len(names) != len(kinds):
        raise RuntimeError(f"{len(names)} names for the kernel's {len(kinds)} barrier calls")
    keys = list(KINDS) if names is None else list(dict.fromkeys(names))
    names = kinds if names is None else names
    seconds = clock.table[:, : len(kinds)].double() / 1e9 / calls
    count = {key: names.count(key) for key in keys}
    work, wait = {}, {}
    for key in keys:
        rows = torch.tensor([name == key for name in names])
        per_thread = seconds[:, rows].sum(1)  # (threads, 2)
        others = per_thread[1:].mean(0) if len(per_thread) > 1 else torch.zeros(2)
        work[key] = (per_thread[0, 0].item(), others[0].item())
        wait[key] = (per_thread[0, 1].item(), others[1].item())
    return Split(count, work, wait)
