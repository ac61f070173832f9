"""Compiled CPU graphs carry the vector ISA they were generated for in inductor's cache key."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._inductor.cpu_vec_isa import valid_vec_isa_list

import recurrent_model as rm
from recurrent_model.compiled import cpu_options
from recurrent_model.inductor_isa import isa_options

#: One compiled graph with row reductions, run from a given inductor cache: its largest error
#: against eager.
PROBE = textwrap.dedent(
    """
    import torch
    from recurrent_model.inductor_isa import isa_options

    def f(x, w):
        return (x * w).sum(-1) + x.softmax(-1).sum(-1)

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 704, generator=g), torch.randn(704, generator=g)
    y = torch.compile(f, fullgraph=True, options={"cpp_wrapper": True, **isa_options()})(x, w)
    print((y - f(x, w)).abs().max().item())
    """
)


def test_cpu_options_name_the_picked_width() -> None:
    assert isa_options().items() <= cpu_options().items()


def test_compile_blocks_names_the_width_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: seen.append(kw))
    model = rm.RecurrentLM(rm.preset("tiny"))
    model.compile_blocks(options={"cpp_wrapper": True, "cpp.simdlen": 128})
    model.compile_blocks(backend="eager")
    n = len(model.blocks())
    assert [kw.get("options") for kw in seen] == [
        {**isa_options(), "cpp_wrapper": True, "cpp.simdlen": 128}
    ] * n + [None] * n


def test_the_width_follows_aten_cpu_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    if not any(isa.bit_width() == 256 for isa in valid_vec_isa_list()):
        pytest.skip("no 256-bit vector ISA on this CPU")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert isa_options() == {"cpp.simdlen": 256}
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert isa_options() == {}


def test_a_width_set_by_the_user_is_left_to_them() -> None:
    from torch._inductor import config

    with config.patch({"cpp.simdlen": 256}):
        assert isa_options() == {}


@pytest.mark.slow
def test_a_graph_cached_for_a_wider_isa_is_not_served_to_a_narrower_one(tmp_path) -> None:
    """A process picking AVX2 after one picking AVX-512, over one inductor cache, gets its own
    graph: the AVX-512 one compiled for AVX2 gives garbage."""
    widths = {isa.bit_width() for isa in valid_vec_isa_list()}
    if not (256 in widths and max(widths) > 256):
        pytest.skip("needs a CPU with a vector ISA wider than AVX2")
    errors = []
    for capability in ("", "avx2"):
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
            "ATEN_CPU_CAPABILITY": capability,
        }
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                             check=True)  # fmt: skip
        errors.append(float(run.stdout.split()[-1]))
    assert max(errors) < 1e-4, errors
