"""Inductor graph passes that change nothing: marks that a compile carries to select one of this
project's code generators and to key inductor's graph cache by that generator's source."""

from __future__ import annotations

import hashlib
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
