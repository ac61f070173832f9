"""A C++ launcher's raw-pointer entry: the lines it is made of, the launchers that get none, and a
compiled decode token through it: the same bits as inductor's entry, its scratch and output checks."""

from __future__ import annotations

import ctypes

import pytest
import torch

import recurrent_model as rm
from recurrent_model import compiled as C
from recurrent_model import inductor_raw_entry as raw_entry
from recurrent_model.inductor_raw_entry import FAILED, TOO_SMALL, RawEntry

_HEAD = [
    "py::gil_scoped_release_simple release;",
    "auto inputs = steal_from_raw_handles_to_raii_handles(input_handles, 3);",
    "int64_t arg0_1;",
    "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_item_int64(inputs[0], &arg0_1));",
    "auto arg1_1 = std::move(inputs[1]);",
    "auto arg2_1 = std::move(inputs[2]);",
    "int64_t s0 = arg0_1;",
]


def _pool(pool: int, sizes: str, strides: str, dtype: str) -> list[str]:
    return [
        f"static constexpr int64_t {sizes}[] = {{4L, }};",
        f"AtenTensorHandle pool{pool}_handle;",
        f"AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(1, {sizes}, {strides}, "
        f"cached_torch_dtype_{dtype}, cached_torch_device_type_cpu, 0, &pool{pool}_handle));",
        f"RAIIAtenTensorHandle pool{pool}(pool{pool}_handle);",
    ]


def _alloc(pool: int, h: int, offset: str, dtype: str, buf: int) -> list[str]:
    return [
        f"AtenTensorHandle tmp_tensor_handle_{h};",
        f"AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch__alloc_from_pool(pool{pool}, {offset}, "
        f"cached_torch_dtype_{dtype}, 1, int_array_1, int_array_1, &tmp_tensor_handle_{h}));",
        f"auto buf{buf} = RAIIAtenTensorHandle(tmp_tensor_handle_{h});",
    ]


def _launcher(*, kernel_args: str = "(float*)(buf3.data_ptr())", tail: tuple = ()) -> list[str]:
    """A launcher body: a scratch pool (pool0) with pointer buffers, an output pool (pool1) whose
    buffer is handed on for reuse and viewed before it is an output, another output (pool2)."""
    return [
        *_HEAD,
        "const int64_t int_array_0[] = {4L + align(16L*s0), };",
        "static constexpr int64_t int_array_1[] = {1L, };",
        "AtenTensorHandle pool0_handle;",
        "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(1, int_array_0, int_array_1, "
        "cached_torch_dtype_uint8, cached_torch_device_type_cpu, 0, &pool0_handle));",
        "RAIIAtenTensorHandle pool0(pool0_handle);",
        "char* buf1_ptr = static_cast<char*>(pool0.data_ptr()) + (align(4L*s0));",
        *_pool(1, "int_array_2", "int_array_1", "float32"),
        *_alloc(1, 0, "0", "float32", 3),
        "auto buf4 = wrap_with_raii_handle_if_needed(reinterpret_tensor_wrapper(buf3, 1, "
        "int_array_1, int_array_1, 2L));  // alias",
        "auto buf5 = std::move(buf3);  // reuse",
        *_pool(2, "int_array_3", "int_array_1", "int64"),
        *_alloc(2, 1, "0", "int64", 6),
        f"cpp_fused_0((const float*)(arg1_1.data_ptr()), (float*)(static_cast<void*>(buf1_ptr)), "
        f"{kernel_args}, (float*)(buf4.data_ptr()), (int64_t*)(buf6.data_ptr()), s0);",
        "cpp_fused_1((const float*)(arg2_1.data_ptr()), (float*)(buf5.data_ptr()));",
        *tail,
        "arg1_1.reset();",
        "pool0.reset(); buf5.reset(); buf4.reset();",
        "output_handles[0] = buf6.release();",
        "output_handles[1] = buf5.release();",
    ]


def test_the_raw_entry_takes_addresses_carves_scratch_and_checks_outputs_before_any_kernel():
    source = raw_entry.raw_source(_launcher())
    assert source is not None
    lines = [line.strip() for line in source.split("\n")]
    body = lines[lines.index("int64_t scratch_used = 0;") :]
    assert body[3:6] == [
        "int64_t arg0_1;",
        "arg0_1 = *static_cast<const int64_t*>(inputs[0]);",  # an integer input: its int64
        "char* arg1_1_ptr = static_cast<char*>(inputs[1]);",
    ]
    scratch = body.index("char* pool0_ptr = scratch + scratch_used;")
    assert body[scratch + 1] == (
        "scratch_used += (recurrent_raw_extent(1, int_array_0, int_array_1) * 1 + 63) / 64 * 64;"
    )
    assert (
        "char* buf1_ptr = static_cast<char*>(static_cast<void*>(pool0_ptr)) + (align(4L*s0));"
        in body
    )
    # each output at the caller's address, its bytes (constant layouts) checked before anything
    assert body[:3] == [
        "int64_t scratch_used = 0;",
        f"if (8 > output_bytes[0]) return {TOO_SMALL};",  # int64 (1,)
        f"if (4 > output_bytes[1]) return {TOO_SMALL};",  # float32 (1,), handed on, then output 1
    ]
    assert "char* buf3_ptr = static_cast<char*>(outputs[1]);" in body
    assert "char* buf6_ptr = static_cast<char*>(outputs[0]);" in body
    assert "char* pool1_ptr = scratch + scratch_used;" in body  # every pool in the scratch
    assert "char* buf4_ptr = buf3_ptr + (2L) * 4;" in body  # a view: item size of its base
    assert "char* buf5_ptr = buf3_ptr;" in body
    first_kernel = next(i for i, line in enumerate(body) if line.startswith("cpp_fused_0("))
    assert body[first_kernel - 1] == "if (scratch_used > scratch_bytes) return scratch_used;"
    assert body[first_kernel] == (
        "cpp_fused_0((const float*)(static_cast<void*>(arg1_1_ptr)), (float*)(static_cast<void*>(buf1_ptr)), "
        "(float*)(static_cast<void*>(buf3_ptr)), (float*)(static_cast<void*>(buf4_ptr)), "
        "(int64_t*)(static_cast<void*>(buf6_ptr)), s0);"
    )  # fmt: skip
    assert f"return {FAILED};" in body  # a kernel that throws does not unwind into the caller
    text = "\n".join(body)
    for handle_work in ("aoti_torch", "RAII", "reset()", "release()", "std::move", "data_ptr()"):
        assert handle_work not in text, handle_work


@pytest.mark.parametrize("change", [
    {"tail": ("AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_foo(buf5));",)},  # an ATen call
    {"kernel_args": "(float*)(buf3)"},  # a handle used other than by its address
    {"tail": (*_pool(7, "int_array_7", "int_array_1", "float32"),)},  # a pool after a kernel
    {"tail": ("foo(arg1_1.data_ptr(), other.data_ptr());",)},  # a line of no known shape
])  # fmt: skip
def test_a_launcher_with_any_unknown_line_gets_no_raw_entry(change):
    assert raw_entry.raw_source(_launcher(**change)) is None


def test_each_output_is_a_buffer_of_constant_layout_of_its_own():
    at_offset = [line.replace(", 0, cached_torch_dtype_int64", ", 64L, cached_torch_dtype_int64")
                 for line in _launcher()]  # fmt: skip
    assert "static_cast<char*>(outputs[0])" in raw_entry.raw_source(at_offset)  # anywhere in a pool
    dynamic = [line.replace("int_array_1[] = {1L, }", "int_array_1[] = {s0, }")
               for line in _launcher()]  # fmt: skip
    assert raw_entry.raw_source(dynamic) is None  # its bytes not known before the kernels run
    twice = _launcher() + ["output_handles[2] = buf5.release();"]
    assert raw_entry.raw_source(twice) is None
    as_input = _launcher() + ["output_handles[2] = arg2_1.release();"]
    assert raw_entry.raw_source(as_input) is None


def test_an_output_in_a_pool_that_earlier_held_scratch_goes_to_the_callers_memory():
    # a launcher's pool whose bytes serve the first kernel's buffers and then an output
    lines = _launcher()
    at = lines.index("auto buf6 = RAIIAtenTensorHandle(tmp_tensor_handle_1);")
    lines[at - 1] = lines[at - 1].replace("(pool2, 0,", "(pool0, 0,")
    source = raw_entry.raw_source(lines)
    assert source is not None
    assert "char* buf6_ptr = static_cast<char*>(outputs[0]);" in source
    assert "char* buf1_ptr = static_cast<char*>(static_cast<void*>(pool0_ptr))" in source


def test_the_entry_goes_after_inductors_and_a_launcher_without_one_is_unchanged():
    body = "\n".join("    " + line for line in _launcher())
    source = f"void inductor_entry_impl(\n    AtenTensorHandle* a\n) {{\n{body}\n}} // inductor_entry_impl\nint tail;"
    out = raw_entry.rewrite(source)
    assert out.startswith(source[: source.index("int tail;")])  # inductor's lines unchanged
    assert f'extern "C" int64_t {raw_entry.SYMBOL}(' in out and out.endswith("\nint tail;")
    odd = source.replace("cpp_fused_1(", "at::foo(")
    assert raw_entry.rewrite(odd) == odd


def test_an_unchecked_torch_gets_no_option(monkeypatch):
    monkeypatch.setattr(raw_entry, "torch_release", lambda: (9, 9))
    assert not raw_entry.install()
    assert raw_entry.compile_options() == {}
    assert RawEntry.load(lambda inputs: inputs, []) is None


@pytest.mark.slow
@pytest.mark.skipif(not (raw_entry.supported() and C.direct_calls_supported()),
                    reason="checked torch releases only")  # fmt: skip
def test_a_decode_token_through_the_raw_entry_gives_inductors_bits():
    from recurrent_model.compiled import CompiledDecode
    from recurrent_model.kv_cache import KVCache

    torch.manual_seed(0)
    cfg = rm.preset("tiny")
    model = rm.RecurrentLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    kw = dict(num_steps=3, stop_tokens=(), init_scale=0.0)
    assert torch.equal(model.generate(ids, 4, compile=True, **kw), model.generate(ids, 4, **kw))
    dec = CompiledDecode(model, KVCache(cfg, 1, 64, 3, None), 3)
    with torch.inference_mode():
        dec(ids, 0, None)
        dec(ids[:, :1], 5, None)
        direct = dec.direct[0]
        assert direct.raw is not None and direct.boxed is not None
        assert direct.raw.scratch.numel() > 0  # grown on its first call, then kept
        for position in (6, 17, 40):  # key counts of one, two and three blocks
            token = (ids[:, :1], dec.positions[position], dec.zero_state, dec.cache.key_valid,
                     dec.keys[position])  # fmt: skip
            through_raw = direct.raw(direct.token_inputs(token))
            through_inductor = direct.boxed(direct.boxed_inputs(token))
            into = direct.raw(direct.token_inputs(token), direct.raw.buffers())
            assert len(through_raw) == len(through_inductor) == len(into) == 3
            for a, b, c in zip(through_raw, through_inductor, into, strict=True):
                assert a.stride() == b.stride() == c.stride() and torch.equal(a, b)
                assert torch.equal(c, b)
        direct.raw.output_bytes[0] -= 1  # an output smaller than its buffer: refused
        with pytest.raises(RuntimeError, match="an output is smaller than its buffer"):
            direct.raw(direct.token_inputs(token))


def test_a_raw_entry_is_kept_only_where_it_returns_the_graphs_outputs(monkeypatch):
    x, s0 = torch.ones(1, 1), torch.zeros(1, 1, 4)
    args = (None, x, None, None, s0, None, None, None, 1, True, True)
    captured = C._Captured(lambda s, x: (x + 1,), ("L['state']", "L['x']"), 1)
    monkeypatch.setattr(C, "boxed_graph", lambda run: lambda inputs: [inputs[1] + 1])

    def fill(value: float, code: int):
        def function(inputs, outputs, output_bytes, scratch, scratch_bytes):  # as the C++ sees them
            first_output = ctypes.c_void_p.from_address(outputs).value
            ctypes.memmove(first_output, ctypes.addressof(ctypes.c_float(value)), 4)
            return code

        return function

    def loading(value: float, code: int):
        def load(cls, boxed, outputs):
            return cls(fill(value, code), tuple((o.shape, o.stride(), o.dtype) for o in outputs))

        return classmethod(load)

    # the graph's value; another value; the graph's value but a refusal (TOO_SMALL) or a throw
    for value, code, kept in [(2.0, 0, True), (3.0, 0, False), (2.0, TOO_SMALL, False),
                              (2.0, FAILED, False)]:  # fmt: skip
        monkeypatch.setattr(RawEntry, "load", loading(value, code))
        with torch.inference_mode():
            direct = C.CompileState().direct_graph((value,), captured, args, (x + 1, s0))
        assert direct is not None and (direct.raw is not None) == kept, (value, code)
        if direct.raw is not None:
            with torch.inference_mode():
                y, _ = direct(torch.full((1, 1), 5.0), None, s0, None, None)
            assert torch.equal(y, torch.full((1, 1), 2.0))  # what the entry wrote: it is used


def test_no_raw_entry_without_a_launcher_library_or_its_symbol(monkeypatch):
    assert raw_entry.library_path(lambda inputs: inputs) is None  # no compiled module inside
    monkeypatch.setattr(raw_entry, "supported", lambda: True)
    monkeypatch.setattr(raw_entry, "library_path", lambda boxed: "/nowhere/gone.so")

    def gone(path):
        raise OSError(f"{path}: cannot open shared object file")

    monkeypatch.setattr(raw_entry.ctypes, "CDLL", gone)
    assert RawEntry.load(lambda inputs: inputs, []) is None
    monkeypatch.setattr(raw_entry.ctypes, "CDLL", lambda path: object())  # loaded, no SYMBOL
    assert RawEntry.load(lambda inputs: inputs, []) is None


def test_a_raw_call_writes_into_its_own_buffers_and_refuses_anothers():
    def write_call_count(inputs, outputs, output_bytes, scratch, scratch_bytes):
        first_output = ctypes.c_void_p.from_address(outputs).value
        written.append(first_output)
        value = ctypes.c_float(float(len(written)))
        ctypes.memmove(first_output, ctypes.addressof(value), 4)
        return 0

    written: list[int] = []
    layouts = ((torch.Size([1]), (1,), torch.float32),)
    call = raw_entry.RawCall(RawEntry(write_call_count, layouts), [None])
    x = torch.zeros(1)
    first = call([(0, x)])[0]  # a new tensor
    into = call.buffers()
    again = call([(0, x)], into)[0]
    assert again is into.tensors[0] and written[-1] == again.data_ptr() != first.data_ptr()
    assert call([(0, x)], into)[0] is again and again.item() == 3.0  # the same tensor, rewritten
    assert first.item() == 1.0 and call([(0, x)])[0] is not again  # new tensors still on request
    twin = raw_entry.RawCall(RawEntry(write_call_count, tuple(list(layouts))), [None])  # equal
    with pytest.raises(ValueError, match="another graph's outputs"):
        twin([(0, x)], into)
    assert len(written) == 4  # the refusal ran nothing
