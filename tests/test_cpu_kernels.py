"""The CPU-kernel settings made when ``recurrent_model`` is imported: products give the same bits on
one thread and on two (MKL's strict reproducibility mode), a process on another ATen CPU path
compiles into an inductor cache of its own, and a setting the user made is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import REPO

from recurrent_model.cpu_kernels import request_thread_independent_products, separate_inductor_cache

# An (11, 192) × (192, 4096) product: MKL's default mode splits its sums between threads.
THREADS_PROBE = """
import recurrent_model, torch
g = torch.Generator().manual_seed(0)
x, w = torch.randn(11, 192, generator=g), torch.randn(4096, 192, generator=g)
torch.set_num_threads(1)
one = torch.nn.functional.linear(x, w)
torch.set_num_threads(2)
two = torch.nn.functional.linear(x, w)
print(torch.equal(one, two))
"""
# A compiled one-row product (recurrent_model.functional.linear) against the eager one.
COMPILE_PROBE = """
import recurrent_model, torch
from recurrent_model import functional as fn
g = torch.Generator().manual_seed(0)
x, w = torch.randn(1, 1, 48, generator=g), torch.randn(80, 48, generator=g)
y = torch.compile(lambda a, b: fn.linear(a, b))(x, w)
print(float((y - torch.nn.functional.linear(x, w)).abs().max()))
"""


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("MKL_CBWR", "TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def test_products_are_the_same_bits_on_one_and_two_threads():
    assert _run(THREADS_PROBE) == "True"


@pytest.mark.slow
def test_a_graph_compiled_natively_is_not_reused_on_the_avx2_path(tmp_path):
    # inductor's graph cache lives under the temporary directory; both runs share this one
    native = float(_run(COMPILE_PROBE, TMPDIR=str(tmp_path)))
    avx2 = float(_run(COMPILE_PROBE, TMPDIR=str(tmp_path), ATEN_CPU_CAPABILITY="avx2"))
    assert native < 1e-5 and avx2 < 1e-5


def test_the_avx2_path_gets_its_cache_when_inductor_was_imported_first():
    code = "import os, torch._inductor.utils, recurrent_model; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    assert _run(code, ATEN_CPU_CAPABILITY="avx2").endswith("aten-avx2")


def test_settings_the_user_made_are_kept():
    assert request_thread_independent_products({}) == "AUTO,STRICT"
    assert request_thread_independent_products({"MKL_CBWR": "AVX2"}) == "AVX2"
    assert separate_inductor_cache({}) is None  # the native path keeps inductor's default
    assert separate_inductor_cache({"ATEN_CPU_CAPABILITY": "AVX2"}).endswith("aten-avx2")
    default = separate_inductor_cache({"ATEN_CPU_CAPABILITY": "avx2"}).removesuffix("/aten-avx2")
    inductors = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": default}
    assert separate_inductor_cache(inductors).endswith("aten-avx2")  # inductor's, not a choice
    mine = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    assert separate_inductor_cache(mine) is None and mine["TORCHINDUCTOR_CACHE_DIR"] == "/mine"
