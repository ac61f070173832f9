"""A second entry into an inductor C++ launcher that takes raw pointers instead of tensors.

Inductor's launcher for a graph is called through a Python wrapper that makes a handle (a new
reference) for each input, the launcher moves each into a tensor handle, reads an integer input
with ``item()``, allocates each memory pool and each output as a tensor, frees every handle after
the kernels ran, and the wrapper turns the output handles back into tensors. A compiled decode
token has ~60 inputs and one kernel: that work is host time on the calling thread, paid on every
token while the other threads wait.

With :func:`raw_entry` among a compile's inductor options, :func:`rewrite` appends to the launcher's
source the function ``SYMBOL``, made from the launcher's own lines (:func:`raw_source`): the same
pointer arithmetic and kernel calls, with each input's address read from an array, each integer
input read from the int64 its array entry points to, each output (a buffer of constant layout) at
the caller's address of that output instead of in its pool, and the pools carved out of one
scratch buffer the caller passes and keeps:

``int64_t SYMBOL(void* const* inputs, void* const* outputs, const int64_t* output_bytes,
char* scratch, int64_t scratch_bytes)`` returns 0 once the kernels ran; ``TOO_SMALL`` where an
output's bytes are fewer than its buffer's; the bytes of scratch it needs where ``scratch_bytes``
is fewer; ``FAILED`` where a kernel threw. It checks the first two before any kernel runs. A
launcher with any line of another shape than those this module knows (an ATen call, an output that
is an input or a view, a pool made after a kernel ran) gets no raw entry, and :class:`RawEntry`
finds none.

The kernels receive the same offsets into each pool, and each output in memory of its own, so they
compute the same bits; :meth:`RawEntry.load`'s caller checks the outputs
against inductor's entry on real inputs before using it. The option is a joint-graph pre-pass that
leaves the graph unchanged; inductor keys its graph cache by its ``uuid`` (this module's source).
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from .inductor_marks import mark, rewrite_launchers
from .inductor_pool_pointers import (
    ALLOCATE_LINE,
    HANDLE_LINE,
    ITEM_SIZE,
    REUSE_LINE,
    VIEW_LINE,
)
from .torch_release import torch_release

#: torch releases whose C++ launcher (``CppWrapperCpu``) the line shapes below were checked against.
CHECKED_TORCH = ((2, 13),)
SYMBOL = "recurrent_raw_entry"
TOO_SMALL, FAILED = -1, -2
#: scratch pools start on this byte boundary (torch's CPU allocations are as aligned)
ALIGN = 64

_BEGIN = "void inductor_entry_impl("
_END = "} // inductor_entry_impl"
_DROP = (
    re.compile(r"py::gil_scoped_release_simple release;"),
    re.compile(r"auto inputs = steal_from_raw_handles_to_raii_handles\(input_handles, \d+\);"),
    re.compile(r"AtenTensorHandle \w+;"),
    re.compile(r"RAIIAtenTensorHandle (\w+)\(\1_handle\);"),
    re.compile(r"(?:\w+\.reset\(\);\s*)+"),  # one or several handles freed
)
_KEEP = (
    re.compile(r"(?:static constexpr |const )?int64_t int_array_\d+\[\] = \{[^;]*\};"),
    re.compile(r"char\* \w+_ptr = [^;]*;"),
    re.compile(r"int64_t \w+( = [^;]*)?;"),
)
_INPUT = re.compile(r"auto (\w+) = std::move\(inputs\[(\d+)\]\);")
_ITEM = re.compile(
    r"AOTI_TORCH_ERROR_CODE_CHECK\(aoti_torch_item_int64\(inputs\[(\d+)\], &(\w+)\)\);"
)
_POOL = re.compile(
    r"AOTI_TORCH_ERROR_CODE_CHECK\(aoti_torch_empty_strided\((\d+), (\w+), (\w+), "
    r"cached_torch_dtype_(\w+), cached_torch_device_type_cpu, 0, &(\w+)_handle\)\);"
)
#: an int64 array of literals only (inductor declares some ``const``, some ``static constexpr``)
_CONSTANT = re.compile(r"(?:static constexpr |const )int64_t (int_array_\d+)\[\] = \{([\dL, ]*)\};")
_OUTPUT = re.compile(r"output_handles\[(\d+)\] = (buf\d+)\.release\(\);")
_KERNEL = re.compile(r"cpp_\w+\(.*\);")
_DATA_PTR = re.compile(r"\b(\w+)\.data_ptr\(\)")

_PRELUDE = """
extern "C" int64_t %s(void* const* inputs, void* const* outputs, const int64_t* output_bytes,
                      char* scratch, int64_t scratch_bytes) {
    try {
    int64_t scratch_used = 0;
"""
_EXTENT = """
static inline int64_t recurrent_raw_extent(int64_t n, const int64_t* sizes, const int64_t* strides) {
    int64_t last = 0;
    for (int64_t d = 0; d < n; ++d) {
        if (sizes[d] == 0) return 0;
        last += (sizes[d] - 1) * strides[d];
    }
    return last + 1;
}"""
_EPILOGUE = """    return 0;
    } catch (...) {
        return %d;
    }
}
"""


class _Allocation(NamedTuple):
    """A buffer taken from a pool: ``aoti_torch__alloc_from_pool``'s arguments."""

    pool: str
    offset: str  # C++ expression of its first byte's offset in the pool
    item_size: int
    ndim: int
    sizes: str  # names of the arrays of its sizes and strides
    strides: str


class _Launcher(NamedTuple):
    """What :func:`raw_source` reads off a launcher's lines before rewriting them."""

    outputs: dict[str, int]  # buffer released as an output -> its index
    allocations: dict[str, _Allocation]  # by the tmp handle it is made into
    made_from: dict[str, str]  # buffer -> its tmp handle
    reused: dict[str, str]  # buffer -> the buffer whose bytes it takes over
    constants: dict[str, list[int]]  # the launcher's constant int64 arrays


def _read(body: list[str]) -> _Launcher:
    launcher = _Launcher({}, {}, {}, {}, {})
    for line in body:
        if (m := _OUTPUT.fullmatch(line)) is not None:
            launcher.outputs[m.group(2)] = int(m.group(1))
        elif (m := ALLOCATE_LINE.fullmatch(line)) is not None and m.group(3) in ITEM_SIZE:
            pool, offset, dtype, ndim, sizes, strides, handle = m.groups()
            launcher.allocations[handle] = _Allocation(
                pool, offset, ITEM_SIZE[dtype], int(ndim), sizes, strides
            )
        elif (m := HANDLE_LINE.fullmatch(line)) is not None:
            launcher.made_from[m.group(1)] = m.group(2)
        elif (m := REUSE_LINE.fullmatch(line)) is not None:
            launcher.reused[m.group(1)] = m.group(2)
        elif (m := _CONSTANT.fullmatch(line)) is not None:
            values = [v.strip().rstrip("L") for v in m.group(2).split(",")]
            launcher.constants[m.group(1)] = [int(v) for v in values if v]
    return launcher


def _extent(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a strided tensor's first element to its last, both included (0 if empty)."""
    if 0 in sizes:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))


def _output_buffers(launcher: _Launcher) -> dict[str, tuple[int, int]] | None:
    """The buffers made from a pool that become the outputs (an output itself, or the buffer whose
    bytes it takes over): name -> (output index, its bytes, from constant sizes and strides); None
    unless every output is such a buffer, each of its own."""
    made: dict[str, tuple[int, int]] = {}
    for name, index in launcher.outputs.items():
        while name in launcher.reused:
            name = launcher.reused[name]
        handle = launcher.made_from.get(name)
        allocation = launcher.allocations.get(handle) if handle is not None else None
        if allocation is None or name in made:
            return None
        sizes = launcher.constants.get(allocation.sizes)
        strides = launcher.constants.get(allocation.strides)
        if sizes is None or strides is None or not len(sizes) == len(strides) == allocation.ndim:
            return None
        made[name] = (index, _extent(sizes, strides) * allocation.item_size)
    if sorted(index for index, _ in made.values()) != list(range(len(made))):
        return None
    return made


def raw_source(launcher_lines: list[str]) -> str | None:
    """C++ of ``SYMBOL`` from the body lines of ``inductor_entry_impl`` (stripped), or None where
    a line is of a shape this module does not know."""
    body = [line.strip() for line in launcher_lines]
    launcher = _read(body)
    output_buffers = _output_buffers(launcher)
    if output_buffers is None:
        return None
    out = [f"if ({nbytes} > output_bytes[{index}]) return {TOO_SMALL};"
           for index, nbytes in sorted(output_buffers.values())]  # fmt: skip
    handles: set[str] = set()  # names whose .data_ptr() reads a char* NAME_ptr
    item_size: dict[str, int | None] = {}
    kernels = 0
    for line in body:
        if not line or any(p.fullmatch(line) for p in _DROP) or _OUTPUT.fullmatch(line):
            continue
        if (m := ALLOCATE_LINE.fullmatch(line)) is not None:
            if m.group(7) not in launcher.allocations:
                return None
            continue
        if (m := _INPUT.fullmatch(line)) is not None:
            name, index = m.groups()
            handles.add(name)
            out.append(f"char* {name}_ptr = static_cast<char*>(inputs[{index}]);")
        elif (m := _ITEM.fullmatch(line)) is not None:
            out.append(f"{m.group(2)} = *static_cast<const int64_t*>(inputs[{m.group(1)}]);")
        elif (m := _POOL.fullmatch(line)) is not None:
            if kernels or m.group(4) not in ITEM_SIZE:
                return None  # a pool made after a kernel ran: the scratch check comes too late
            ndim, sizes, strides, dtype, pool = m.groups()
            handles.add(pool)
            nbytes = f"recurrent_raw_extent({ndim}, {sizes}, {strides}) * {ITEM_SIZE[dtype]}"
            out.append(f"char* {pool}_ptr = scratch + scratch_used;")
            out.append(f"scratch_used += ({nbytes} + {ALIGN - 1}) / {ALIGN} * {ALIGN};")
        elif (m := HANDLE_LINE.fullmatch(line)) is not None:
            name, handle = m.groups()
            allocation = launcher.allocations[handle]
            handles.add(name)
            item_size[name] = allocation.item_size
            if name in output_buffers:  # at the caller's output, wherever its pool would put it
                out.append(
                    f"char* {name}_ptr = static_cast<char*>(outputs[{output_buffers[name][0]}]);"
                )
            else:
                out.append(f"char* {name}_ptr = {allocation.pool}_ptr + ({allocation.offset});")
        elif (m := VIEW_LINE.fullmatch(line)) is not None:
            name, base, offset = m.groups()
            if item_size.get(base) is None or base not in handles:
                return None
            handles.add(name)
            item_size[name] = item_size[base]
            out.append(f"char* {name}_ptr = {base}_ptr + ({offset}) * {item_size[base]};")
        elif (m := REUSE_LINE.fullmatch(line)) is not None:
            name, base = m.groups()
            if base not in handles:
                return None
            handles.add(name)
            item_size[name] = None  # maybe another dtype: no views of it
            out.append(f"char* {name}_ptr = {base}_ptr;")
        elif _KERNEL.fullmatch(line) is not None or any(p.fullmatch(line) for p in _KEEP):
            if _KERNEL.fullmatch(line) is not None and not kernels:
                out.append("if (scratch_used > scratch_bytes) return scratch_used;")
                kernels += 1
            out.append(line)
        else:
            return None
    if not kernels:
        return None
    text = "\n".join(f"    {line}" for line in out)
    if any(name not in handles for name in _DATA_PTR.findall(text)):
        return None
    text = _DATA_PTR.sub(lambda m: f"static_cast<void*>({m.group(1)}_ptr)", text)
    names = "|".join(map(re.escape, handles))
    if handles and re.search(rf"\b(?:{names})\b(?!_ptr)", text):
        return None  # a handle used other than by its address
    return _EXTENT + (_PRELUDE % SYMBOL) + text + "\n" + (_EPILOGUE % FAILED)


def rewrite(source: str) -> str:
    """``source`` (a C++ launcher) with ``SYMBOL`` inserted after ``inductor_entry_impl``; unchanged
    where :func:`raw_source` makes none."""
    begin = source.find(_BEGIN)
    end = source.find(_END, begin)
    if begin < 0 or end < 0:
        return source
    opened = source.find(") {\n", begin)
    if opened < 0 or opened > end:
        return source
    body = source[opened + len(") {\n") : end].split("\n")
    raw = raw_source(body)
    if raw is None:
        return source
    at = end + len(_END)
    return source[:at] + "\n" + raw + source[at:]


@functools.cache
def raw_entry() -> Any:
    """The option's value: a joint-graph pre-pass that changes nothing, present to select the
    rewritten launcher and to key inductor's cache by this module's source."""
    return mark("RawEntry", __file__)


def _selected() -> bool:
    from torch._inductor import config

    return type(config.joint_custom_pre_pass) is type(raw_entry())


def supported() -> bool:
    """Whether this torch's C++ launcher is one the rewrite was checked against."""
    return torch_release() in CHECKED_TORCH


def install() -> bool:
    """Wrap the C++ launcher's code generator (once) so that a compile with :func:`raw_entry` gets
    :func:`rewrite`; False where this torch is not a checked release (nothing is changed)."""
    if not supported():
        return False
    rewrite_launchers("raw_entry", _selected, rewrite)
    return True


def compile_options() -> dict[str, Any]:
    """The inductor option that appends the raw entry, with the code generator wrapped; empty where
    this torch is not a checked release."""
    return {"joint_custom_pre_pass": raw_entry()} if install() else {}


def library_path(boxed: Callable) -> str | None:
    """The shared library of the launcher that inductor's boxed callable ``boxed`` calls, or None
    where it is not such a callable (inductor's ``_wrap_func`` closure over a compiled module)."""
    for cell in getattr(boxed, "__closure__", None) or ():
        module = getattr(cell.cell_contents, "__self__", None)
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".so"):
            return path
    return None


#: an output's shape, strides and dtype
Layout = tuple[torch.Size, tuple[int, ...], torch.dtype]


def _extent_bytes(layout: Layout) -> int:
    """Bytes from an output's first element to the end of its last."""
    shape, strides, dtype = layout
    return _extent(shape, strides) * dtype.itemsize


class RawEntry(NamedTuple):
    """``SYMBOL`` of one compiled launcher and the layouts of its outputs."""

    function: Any  # the ctypes function
    layouts: tuple[Layout, ...]

    @classmethod
    def load(cls, boxed: Callable, outputs: list[torch.Tensor]) -> RawEntry | None:
        """The raw entry of ``boxed``'s launcher, whose outputs are laid out as ``outputs`` (those
        of a call through inductor's entry), or None where its library has no ``SYMBOL``."""
        path = library_path(boxed)
        if path is None or not supported():
            return None
        try:
            function = getattr(ctypes.CDLL(path), SYMBOL, None)
        except OSError:  # the library's file is gone: inductor's entry stays
            return None
        if function is None:
            return None
        function.restype = ctypes.c_int64
        function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
        return cls(function, tuple((o.shape, o.stride(), o.dtype) for o in outputs))


class OutputBuffers(NamedTuple):
    """Output tensors of one :class:`RawCall`, made once (:meth:`RawCall.buffers`): every call given
    them as ``into`` writes its outputs there instead of into new tensors."""

    tensors: tuple[torch.Tensor, ...]
    layouts: tuple[Layout, ...]  # the entry's own tuple: the graph whose outputs these are
    pointers: Any  # the ctypes array of the tensors' addresses
    address: int  # that array's


class RawCall:
    """A graph called through its :class:`RawEntry`: the fixed inputs' addresses written once, the
    others on each call, the outputs new tensors or :meth:`buffers` kept by the caller, the scratch
    pools kept between calls (so one call at a time, like the decode cache the graph writes)."""

    def __init__(self, entry: RawEntry, inputs: list[torch.Tensor | None]) -> None:
        """``inputs``: the graph's inputs, None for those given on each call."""
        self.entry = entry
        self.inputs = inputs  # the fixed inputs stay alive as long as their addresses are used
        self.pointers = (ctypes.c_void_p * len(inputs))(
            *(None if t is None else t.data_ptr() for t in inputs)
        )
        n = len(entry.layouts)
        self.output_pointers = (ctypes.c_void_p * n)()
        self.output_bytes = (ctypes.c_int64 * n)(*map(_extent_bytes, entry.layouts))
        # the arrays' addresses as plain integers: ctypes converts those fastest
        self.input_at = ctypes.addressof(self.pointers)
        self.output_at = ctypes.addressof(self.output_pointers)
        self.bytes_at = ctypes.addressof(self.output_bytes)
        self.scratch = torch.empty(0, dtype=torch.uint8)
        self.scratch_at = (self.scratch.data_ptr(), 0)

    def buffers(self) -> OutputBuffers:
        """New output tensors for ``into``, laid out as the entry's outputs."""
        layouts = self.entry.layouts
        tensors = tuple(torch.empty_strided(s, st, dtype=d) for s, st, d in layouts)
        pointers = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
        return OutputBuffers(tensors, layouts, pointers, ctypes.addressof(pointers))

    def _run(self, outputs_at: int) -> int:
        return self.entry.function(self.input_at, outputs_at, self.bytes_at, *self.scratch_at)

    def __call__(
        self, per_call: Iterable[tuple[int, torch.Tensor]], into: OutputBuffers | None = None
    ) -> Sequence[torch.Tensor]:
        """Run the graph with input ``i`` at the address of each ``(i, tensor)`` of ``per_call``
        (every input not fixed at construction; an integer input: a 0-dim int64 tensor holding
        it): its outputs, written into ``into`` (this call's :meth:`buffers`) or new tensors."""
        for i, tensor in per_call:
            self.pointers[i] = tensor.data_ptr()
        if into is None:
            outputs: Sequence[torch.Tensor] = [
                torch.empty_strided(s, st, dtype=d) for s, st, d in self.entry.layouts
            ]
            for j, out in enumerate(outputs):
                self.output_pointers[j] = out.data_ptr()
            outputs_at = self.output_at
        elif into.layouts is self.entry.layouts:
            outputs, outputs_at = into.tensors, into.address
        else:
            raise ValueError("output buffers laid out for another graph's outputs")
        code = self._run(outputs_at)
        if code > 0:  # its pools need more scratch than it had: nothing ran
            self.scratch = torch.empty(code, dtype=torch.uint8)
            self.scratch_at = (self.scratch.data_ptr(), code)
            code = self._run(outputs_at)
        if code != 0:
            problem = {TOO_SMALL: "an output is smaller than its buffer", FAILED: "a kernel threw"}
            raise RuntimeError(
                f"compiled graph's raw entry: {problem.get(code, f'returned {code}')}"
            )
        return outputs
