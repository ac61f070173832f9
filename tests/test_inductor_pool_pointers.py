"""A C++ launcher's pooled intermediates as raw pointers: which buffers become pointers, which stay
tensors, the lines kept, and the same bits from a compiled graph."""

from __future__ import annotations

import pytest
import torch
from helpers import compiled_with_code

from recurrent_model import inductor_pool_pointers as pool_pointers
from recurrent_model.compiled import CPU_OPTIONS
from recurrent_model.inductor_isa import isa_options

_ALLOC = (
    "    AtenTensorHandle tmp_tensor_handle_{h};\n"
    "    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch__alloc_from_pool(pool0, {offset}, "
    "cached_torch_dtype_{dtype}, 1, int_array_1, int_array_2, &tmp_tensor_handle_{h}));\n"
    "    auto buf{b} = RAIIAtenTensorHandle(tmp_tensor_handle_{h});"
)
_VIEW = (
    "    auto buf{b} = wrap_with_raii_handle_if_needed(reinterpret_tensor_wrapper(buf{base}, 1, "
    "int_array_3, int_array_4, {offset}));  // alias"
)


def _launcher() -> str:
    return "\n".join([
        "    RAIIAtenTensorHandle pool0(pool0_handle);",
        _ALLOC.format(h=0, offset="align(16L*s0)", dtype="float32", b=1),  # kernels only
        _ALLOC.format(h=1, offset="64L", dtype="bfloat16", b=2),  # viewed, views used by kernels
        _VIEW.format(b=3, base=2, offset="8L"),
        _VIEW.format(b=4, base=3, offset="2L"),
        _ALLOC.format(h=2, offset="128L", dtype="float32", b=5),  # a view of it is an output
        _VIEW.format(b=6, base=5, offset="0L"),
        _ALLOC.format(h=3, offset="256L", dtype="float32", b=7),  # handed on for reuse
        "    auto buf8 = std::move(buf7);  // reuse",
        _ALLOC.format(h=5, offset="768L", dtype="float32", b=10),  # reused, then an ATen argument
        "    auto buf11 = std::move(buf10);  // reuse",
        _ALLOC.format(h=6, offset="1024L", dtype="float32", b=13),  # reused, then viewed
        "    auto buf14 = std::move(buf13);  // reuse",
        _VIEW.format(b=15, base=14, offset="4L"),
        _ALLOC.format(h=4, offset="512L", dtype="float32", b=9),  # an ATen call's argument
        "    cpp_fused_0((float*)(buf1.data_ptr()), (bfloat16*)(buf4.data_ptr()), "
        "(float*)(buf5.data_ptr()), (float*)(buf8.data_ptr()), (float*)(buf12.data_ptr()));",
        "    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_foo(buf9, buf3.data_ptr()));",
        "    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_foo(buf11, buf15.data_ptr()));",
        "    buf2.reset(); buf3.reset();",
        "    pool0.reset(); buf1.reset(); buf8.reset(); buf9.reset(); buf4.reset();",
        "    output_handles[0] = buf6.release();",
    ])  # fmt: skip


def test_pointer_only_buffers_become_pointers_into_their_pool_and_the_rest_stay_tensors():
    source = _launcher()
    out = pool_pointers.rewrite(source)
    lines = out.split("\n")
    assert len(lines) == len(source.split("\n"))  # inductor's line map still holds
    assert "    char* buf1_ptr = static_cast<char*>(pool0.data_ptr()) + (align(16L*s0));" in lines
    assert "    char* buf2_ptr = static_cast<char*>(pool0.data_ptr()) + (64L);" in lines
    assert "    char* buf3_ptr = buf2_ptr + (8L) * 2;" in lines  # bf16: 2 bytes per element
    assert "    char* buf4_ptr = buf3_ptr + (2L) * 2;" in lines  # a view of a view
    assert "    char* buf8_ptr = buf7_ptr;" in lines  # reuse: the same bytes under a new name
    assert ("    cpp_fused_0((float*)(static_cast<void*>(buf1_ptr)), "
            "(bfloat16*)(static_cast<void*>(buf4_ptr)), (float*)(buf5.data_ptr()), "
            "(float*)(static_cast<void*>(buf8_ptr)), (float*)(buf12.data_ptr()));") in lines  # fmt: skip
    assert "aoti_torch_cpu_foo(buf9, static_cast<void*>(buf3_ptr))" in out
    assert "    pool0.reset();   buf9.reset(); " in lines  # only pointers' resets go
    # an output's base and the output, an ATen argument, a reused buffer that becomes one, and a
    # reused buffer that is viewed (its dtype may differ from the buffer it took over)
    for kept in (5, 6, 9, 10, 11, 13, 14, 15):
        assert f"auto buf{kept} = " in out and f"buf{kept}_ptr" not in out
    assert "tmp_tensor_handle_0" not in out and "tmp_tensor_handle_2" in out


def test_a_buffer_read_after_its_pool_is_released_stays_a_tensor():
    source = "\n".join([
        _ALLOC.format(h=0, offset="0L", dtype="float32", b=1),
        _ALLOC.format(h=1, offset="64L", dtype="float32", b=2),
        "    cpp_fused_0((float*)(buf1.data_ptr()), (float*)(buf2.data_ptr()));",
        "    pool0.reset(); buf1.reset();",
        "    cpp_fused_1((float*)(buf2.data_ptr()));",  # the tensor keeps the pool's bytes alive
        "    buf2.reset();",
    ])  # fmt: skip
    out = pool_pointers.rewrite(source)
    assert "char* buf1_ptr" in out and "buf2_ptr" not in out
    assert "cpp_fused_1((float*)(buf2.data_ptr()));" in out


def test_a_launcher_without_pooled_buffers_is_returned_as_it_is():
    source = "    auto buf0 = RAIIAtenTensorHandle(tmp_tensor_handle_0);\n    buf0.reset();"
    assert pool_pointers.rewrite(source) == source


def test_an_unchecked_torch_gets_no_option_and_no_code_generator(monkeypatch):
    monkeypatch.setattr(pool_pointers, "torch_release", lambda: (9, 9))
    assert not pool_pointers.install()
    assert pool_pointers.compile_options() == {}


def _norm_between_products(x, w1, w2, g):
    h = (x[None, :] * w1).sum(-1)
    h = h * torch.rsqrt(h.pow(2).mean() + 1e-6) * g
    h = torch.cat([(h[None, :] * part).sum(-1) for part in w2.chunk(4)])
    return h * torch.rsqrt(h.pow(2).mean() + 1e-6)


@pytest.mark.skipif(not pool_pointers.supported(), reason="the rewrite is for checked releases")
def test_a_compiled_launcher_passes_pool_pointers_and_computes_the_same_bits():
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(512, generator=g), torch.randn(256, 512, generator=g),
              torch.randn(1024, 256, generator=g), torch.randn(256, generator=g))  # fmt: skip
    options = {**CPU_OPTIONS, **isa_options()}
    plain, plain_code = compiled_with_code(_norm_between_products, options, inputs)
    with_pointers = {**options, **pool_pointers.compile_options()}
    rewritten, code = compiled_with_code(_norm_between_products, with_pointers, inputs)
    assert torch.equal(rewritten, plain)
    assert "aoti_torch__alloc_from_pool" in plain_code and "_ptr = " not in plain_code
    assert code.count("aoti_torch__alloc_from_pool") < plain_code.count(
        "aoti_torch__alloc_from_pool"
    )
    assert "_ptr = static_cast<char*>(pool" in code
    # a compile without the option is inductor's own again
    again, _ = compiled_with_code(_norm_between_products, options, inputs)
    assert torch.equal(again, plain)
