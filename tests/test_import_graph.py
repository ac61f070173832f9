"""The project's import graph has no cycle and every layer imports only the layers below it
(docs/contributing.md, "Layers and import cycles").

Every ``.py`` file under the project's packages is parsed with ``ast`` and every import statement
counts, at module level and inside functions: an import inside a function that closes a loop is
still a loop, it only waits for the function to run. Imports inside an ``if TYPE_CHECKING:`` block
are skipped, because that block never executes. ``from pkg import name`` is an edge to ``pkg.name``
when that is a module of the project, else to ``pkg``; relative imports resolve against the
importing module's package; in a directory without ``__init__.py`` (bench/, eval/: scripts) a bare
import of a sibling file is an edge to it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from helpers import REPO

PACKAGES = ("recurrent_model", "workbench", "pretrain", "cluster", "tasks", "apps", "eval", "bench")
BELOW = ("tasks", "cluster", "recurrent_model")
ON_TOP = ("apps", "eval", "bench")
FORBIDDEN: dict[str, tuple[str, ...]] = {  # package -> the packages it must not import
    **{low: tuple(p for p in PACKAGES if p != low) for low in BELOW},
    "workbench": ("pretrain", *ON_TOP),
    "pretrain": ("workbench", *ON_TOP),
}

Edges = dict[tuple[str, str], list[str]]  # (importer, imported) -> ["path:line", ...]


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``packages`` of ``root``."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def executed_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``node`` except those in ``if TYPE_CHECKING:`` bodies."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    elif isinstance(node, ast.If) and is_type_checking(node.test):
        for other in node.orelse:
            yield from executed_imports(other)
    else:
        for child in ast.iter_child_nodes(node):
            yield from executed_imports(child)


def package_of(module: str, path: Path) -> str:
    """The package a relative import in ``module`` starts from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is a module of the project."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def targets(
    node: ast.Import | ast.ImportFrom, module: str, path: Path, modules: dict[str, Path]
) -> Iterator[str]:
    """The project modules one import statement of ``module`` (in ``path``) runs."""
    package = package_of(module, path)
    scripts = not (path.parent / "__init__.py").exists()

    def absolute(name: str) -> str:
        """A script's bare import of a sibling file, as that file's module name."""
        sibling = f"{package}.{name}"
        return sibling if scripts and known(sibling, modules) not in (None, package) else name

    if isinstance(node, ast.Import):
        for alias in node.names:
            if found := known(absolute(alias.name), modules):
                yield found
        return
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    else:
        base = absolute(base)
    for alias in node.names:
        if found := known(f"{base}.{alias.name}", modules) or known(base, modules):
            yield found


def import_edges(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> Edges:
    """Every executed import between modules of ``packages``, with where it is written."""
    modules = module_files(root, packages)
    edges: Edges = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in executed_imports(tree):
            where = f"{path.relative_to(root)}:{node.lineno}"
            for target in set(targets(node, module, path, modules)) - {module}:
                edges.setdefault((module, target), []).append(where)
    return edges


def cycles(edges: Edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe_cycles(edges: Edges) -> str:
    """Each cycle's modules and the imports between them."""
    lines = []
    for component in cycles(edges):
        lines.append("cycle: " + ", ".join(component))
        members = set(component)
        for (a, b), places in sorted(edges.items()):
            if a in members and b in members:
                lines.append(f"    {a} -> {b} ({', '.join(places)})")
    return "\n".join(lines)


def layer_violations(edges: Edges) -> list[str]:
    """The imports from a layer into one it must not import (``FORBIDDEN``)."""
    bad = []
    for (a, b), places in sorted(edges.items()):
        if b.split(".")[0] in FORBIDDEN.get(a.split(".")[0], ()):
            bad.append(f"{a} -> {b} ({', '.join(places)})")
    return bad


def test_the_project_has_no_import_cycle():
    """No module reaches itself through imports that run (function-level ones included)."""
    report = describe_cycles(import_edges())
    assert not report, "\n" + report


def test_every_layer_imports_only_the_layers_below_it():
    """tasks, cluster and recurrent_model import no other part of the project; workbench and
    pretrain never import each other, nor apps, eval or bench."""
    bad = layer_violations(import_edges())
    assert not bad, "\n" + "\n".join(bad)


def write_package(root: Path, files: dict[str, str]) -> None:
    """``files`` (relative path -> source) under ``root``."""
    for name, source in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(source, encoding="utf-8")


def test_the_checker_sees_function_level_and_relative_imports_and_skips_type_checking(tmp_path):
    """A loop closed inside a function, through a relative ``from . import``, is found with the
    line that closes it; an import behind ``if TYPE_CHECKING:`` is no edge; a script's bare import
    of its sibling is."""
    write_package(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/a.py": "def f():\n    from . import b\n",
            "low/b.py": "from low.a import f\nimport high.top\n",
            "high/__init__.py": "",
            "high/top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import low.a\n",
            "scripts/run.py": "import helper\n",
            "scripts/helper.py": "from low import b\n",
        },
    )
    edges = import_edges(tmp_path, ("low", "high", "scripts"))
    assert cycles(edges) == [["low.a", "low.b"]]
    assert ("high.top", "low.a") not in edges
    assert "low/a.py:2" in describe_cycles(edges)
    assert ("low.b", "high.top") in edges
    assert ("scripts.run", "scripts.helper") in edges and ("scripts.helper", "low.b") in edges
