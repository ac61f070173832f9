"""An inductor C++ launcher's pooled intermediates as raw pointers instead of tensors.

With ``memory_planning`` and ``cpp_wrapper``, inductor's C++ launcher takes a graph's intermediate
buffers from a few memory pools, each as a tensor: ``aoti_torch__alloc_from_pool`` and
``reinterpret_tensor_wrapper`` make a TensorImpl for every buffer and every view of one on every
call, and ``reset`` frees it. A compiled decode token has hundreds of such buffers (each
projection's row groups, each layer's norms, attention scores and cache writes); its kernels read
nothing of them but the address: making and freeing them is host work on the calling thread while
the other threads wait at the kernel's start.

With :func:`pool_pointers` among a compile's inductor options, the launcher's source is rewritten
after inductor writes it (:func:`rewrite`). A pooled buffer whose every use is ``.data_ptr()`` or
``.reset()``, none of them a read after its pool is released, and whose views are such buffers too,
becomes ``char* bufN_ptr`` = its pool's address + its byte offset (a view: its base's pointer +
offset × item size; a buffer handed on for reuse: the same pointer under the new name); its uses
read the pointer and its resets go. A buffer used any other way (a graph output, an argument of an
ATen call) stays a tensor, and so does every view of it and every buffer it is handed on to or from.
The kernels receive the same addresses as before, so they compute the same bits; lines keep their
numbers, so inductor's line map still holds.

The option is a post-grad pre-pass that leaves the graph unchanged; inductor keys its graph cache by
its :meth:`uuid` (this module's source), so a rewritten launcher and inductor's own never share an
entry. :func:`install` wraps the launcher's code generator once per process, on the torch releases
whose launcher it was checked against; elsewhere :func:`compile_options` adds nothing.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from typing import Any, NamedTuple

from .inductor_marks import mark, rewrite_launchers
from .torch_release import torch_release

#: torch releases whose C++ launcher (``CppWrapperCpu``: pool allocation and view lines, handle
#: resets) this module's rewrite was checked against.
CHECKED_TORCH = ((2, 13),)

_DECLARE = re.compile(r"AtenTensorHandle (tmp_tensor_handle_\d+);")
#: a buffer from a pool: pool, byte offset, dtype, dimensions, sizes and strides arrays, handle
ALLOCATE_LINE = re.compile(
    r"AOTI_TORCH_ERROR_CODE_CHECK\(aoti_torch__alloc_from_pool\((\w+), (.+), "
    r"cached_torch_dtype_(\w+), (\d+), (\w+), (\w+), &(tmp_tensor_handle_\d+)\)\);"
)
HANDLE_LINE = re.compile(r"auto (buf\d+) = RAIIAtenTensorHandle\((tmp_tensor_handle_\d+)\);")
VIEW_LINE = re.compile(
    r"auto (buf\d+) = wrap_with_raii_handle_if_needed\(reinterpret_tensor_wrapper\("
    r"(buf\d+), \d+, \w+, \w+, (.+)\)\);  // alias"
)
REUSE_LINE = re.compile(r"auto (buf\d+) = std::move\((buf\d+)\);  // reuse")
_BUFFER = re.compile(r"\bbuf\d+\b")
_POINTER_USE = re.compile(r"\b(buf\d+)(\.data_ptr\(\)|\.reset\(\);)")
_RELEASE = re.compile(r"\b(\w+)\.reset\(\);")
ITEM_SIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
              "int16": 2, "int8": 1, "uint8": 1, "bool": 1}  # fmt: skip


class _Pooled(NamedTuple):
    """A buffer the launcher makes from a pool or as a view of such a buffer."""

    lines: tuple[int, ...]  # the lines that make it; the last one defines its name
    pool: str  # the pool its bytes are in
    address: str  # C++ expression of its first byte, as char*
    item_size: int | None  # bytes per element (a view's offset counts them); None: not known
    base: str | None  # the buffer a view is of, or that a reused one takes over


def _pooled(lines: list[str]) -> dict[str, _Pooled]:
    """Every buffer taken from a pool or viewed from one, by name, in the order made."""
    allocations: dict[str, tuple[int, str, str, int]] = {}
    pooled: dict[str, _Pooled] = {}
    for i, line in enumerate(lines):
        text = line.strip()
        if (m := ALLOCATE_LINE.fullmatch(text)) is not None:
            pool, offset, dtype, _, _, _, handle = m.groups()
            declared = i > 0 and _DECLARE.fullmatch(lines[i - 1].strip())
            if dtype in ITEM_SIZE and declared and declared.group(1) == handle:
                allocations[handle] = (i, pool, offset, ITEM_SIZE[dtype])
        elif (m := HANDLE_LINE.fullmatch(text)) is not None and m.group(2) in allocations:
            at, pool, offset, size = allocations.pop(m.group(2))
            address = f"static_cast<char*>({pool}.data_ptr()) + ({offset})"
            pooled[m.group(1)] = _Pooled((at - 1, at, i), pool, address, size, None)
        elif (m := VIEW_LINE.fullmatch(text)) is not None and m.group(2) in pooled:
            name, base, offset = m.groups()
            size = pooled[base].item_size
            if size is not None:
                address = f"{base}_ptr + ({offset}) * {size}"
                pooled[name] = _Pooled((i,), pooled[base].pool, address, size, base)
        elif (m := REUSE_LINE.fullmatch(text)) is not None and m.group(2) in pooled:
            name, base = m.groups()  # the same bytes, maybe another dtype: no views of it
            pooled[name] = _Pooled((i,), pooled[base].pool, f"{base}_ptr", None, base)
    return pooled


def _pointer_only(lines: list[str], pooled: dict[str, _Pooled]) -> set[str]:
    """The pooled buffers used only through ``.data_ptr()``, ``.reset()`` and views that are
    themselves pointer-only, and only before their pool is released (a tensor keeps its pool's
    bytes alive, a pointer does not); a view of a buffer that stays a tensor stays a tensor too."""
    made_on = {i: name for name, p in pooled.items() for i in p.lines}
    released = {}  # pool -> the first line that releases it
    for i, line in enumerate(lines):
        for pool in _RELEASE.findall(line):
            released.setdefault(pool, i)
    kept: set[str] = set()
    for i, line in enumerate(lines):
        for m in _BUFFER.finditer(line):
            name = m.group()
            if name not in pooled or made_on.get(i) == name:
                continue
            if i in made_on and pooled[made_on[i]].base == name:
                continue  # the line that makes a view of it: decided with the view below
            read = line.startswith(".data_ptr()", m.end())
            reset = line.startswith(".reset();", m.end())
            # read after its pool is released: only a tensor keeps the bytes alive
            late = read and i >= released.get(pooled[name].pool, len(lines))
            if not (read or reset) or late:
                kept.add(name)
    views = defaultdict(list)
    for name, p in pooled.items():
        if p.base is not None:
            views[p.base].append(name)
    changed = True
    while changed:
        changed = False
        for name, p in pooled.items():
            if name not in kept and (p.base in kept or any(v in kept for v in views[name])):
                kept.add(name)
                changed = True
    return set(pooled) - kept


def rewrite(source: str) -> str:
    """``source`` (a C++ launcher) with its pointer-only pooled buffers as raw pointers; the same
    number of lines."""
    lines = source.split("\n")
    pooled = _pooled(lines)
    pointers = _pointer_only(lines, pooled)
    if not pointers:
        return source
    for name in pointers:
        *made, defined = pooled[name].lines
        for i in made:
            lines[i] = ""
        line = lines[defined]
        indent = line[: len(line) - len(line.lstrip())]
        lines[defined] = f"{indent}char* {name}_ptr = {pooled[name].address};"

    def use(m: re.Match) -> str:
        name, how = m.groups()
        if name not in pointers:
            return m.group()
        return f"static_cast<void*>({name}_ptr)" if how == ".data_ptr()" else ""

    return "\n".join(_POINTER_USE.sub(use, line) for line in lines)


@functools.cache
def pool_pointers() -> Any:
    """The option's value: a post-grad pre-pass that changes nothing, present to select the
    rewritten launcher and to key inductor's cache by this module's source
    (:func:`inductor_marks.mark`)."""
    return mark("PoolPointers", __file__)


def _selected() -> bool:
    """Whether the launcher being written belongs to a compile with :func:`pool_pointers`."""
    from torch._inductor import config

    return type(config.post_grad_custom_pre_pass) is type(pool_pointers())  # copies count too


def supported() -> bool:
    """Whether this torch's C++ launcher is one the rewrite was checked against."""
    return torch_release() in CHECKED_TORCH


def install() -> bool:
    """Wrap the C++ launcher's code generator (once) so that a compile with :func:`pool_pointers`
    gets :func:`rewrite`; False where this torch is not a checked release (nothing is changed)."""
    if not supported():
        return False
    rewrite_launchers("pool_pointers", _selected, rewrite)
    return True


def compile_options() -> dict[str, Any]:
    """The inductor option that rewrites the launcher, with the code generator wrapped; empty
    where this torch is not a checked release."""
    return {"post_grad_custom_pre_pass": pool_pointers()} if install() else {}
