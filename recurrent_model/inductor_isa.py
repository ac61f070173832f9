"""The vector ISA inductor generates CPU code for, named in its compile options.

Inductor picks the ISA per process (the CPU's flags, ``ATEN_CPU_CAPABILITY``) but its on-disk graph
cache keys a graph on the compile options, not on that pick. A graph generated for AVX-512 (loops
stepping 16 floats) and served from the cache to a process that picks AVX2 is compiled for vectors of
8: its loads and stores run past their vectors and the results are garbage (NaN in the compiled
prefill). ``cpp.simdlen`` set to the picked ISA's width selects that same ISA and puts the width in
the cache key, so each ISA gets graphs generated for it in any cache directory: a process's own per
capability (:mod:`.cpu_kernels`) or one shared by machines of different CPUs. ISAs of one width
(AVX-512 with and without AMX) still share graphs: inductor uses AMX only in its matmul templates
(max-autotune).
"""

from __future__ import annotations


def isa_options() -> dict[str, int]:
    """``{"cpp.simdlen": bits}`` of the ISA inductor picks in this process; empty when it picks
    none (inductor's scalar code, the same under every pick) or when ``cpp.simdlen`` is set already
    (the user's pick, and in the key)."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa  # the compiler loads on first use only

    if config.cpp.simdlen is not None:
        return {}
    width = pick_vec_isa().bit_width()
    return {"cpp.simdlen": width} if width else {}
