"""Inductor graph passes that change nothing: marks that a compile carries to select one of this
project's code generators and to key inductor's graph cache by that generator's source; and the
hook by which a generator rewrites the C++ launcher of the compiles that carry its mark."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from typing import Any


def source_hash(path: str) -> str:
    """sha256 of the file at ``path``: a generator's version, as its cache key."""
    with open(path, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def mark(name: str, path: str) -> Any:
    """A post-grad pass named ``name`` that leaves the graph as it is, whose ``uuid`` (which
    inductor folds into its cache key) is the source of the generator at ``path``. Each call makes a
    new class: a caller keeps one (``functools.cache``) and recognises it by type. Built on first
    use: inductor's pass classes load with the compiler."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    version = source_hash(path)

    def run(self: Any, graph: Any) -> None:
        return None

    def uuid(self: Any) -> str:
        return version

    return type(name, (CustomGraphPass,), {"__call__": run, "uuid": uuid})()


def rewrite_launchers(
    tag: str, selected: Callable[[], bool], rewrite: Callable[[str], str]
) -> None:
    """Wrap inductor's C++ launcher generator (``CppWrapperCpu.generate``) so that the launcher of a
    compile for which ``selected()`` holds is ``rewrite(launcher)``; once per ``tag``. Rewrites
    installed later see the launchers of those installed earlier."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    generate = CppWrapperCpu.generate
    tags = getattr(generate, "launcher_rewrites", ())
    if tag in tags:
        return

    @functools.wraps(generate)
    def rewriting(self: Any, is_inference: bool) -> Any:
        code, declarations = generate(self, is_inference)
        if selected():
            code = dataclasses.replace(code, value=rewrite(code.value))
        return code, declarations

    rewriting.launcher_rewrites = (*tags, tag)  # type: ignore[attr-defined]
    CppWrapperCpu.generate = rewriting
