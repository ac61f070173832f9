"""The project's own held-out prompt sets, by name, and the token categories of a census.

Sources (each ``n`` prompts, deterministic in ``seed``): numpy source code the model never saw
(``code``), GSM8k-style word problems with worked answers in the training frame (``prose``) and as
bare sentences (``plain_prose``, like the app's default prompt), held-out arithmetic
(``arithmetic``) and held-out depth tasks at trained and harder levels (``depth``). Each prompt
carries a difficulty (digits, or the task's level) so results can be grouped by it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

EXCLUDED_PARTS = {"tests", "testing", "_vendored", "f2py", "__pycache__"}
OPERATORS = set("+-*/%=<>!&|^~@")
CODE_SOURCES = {"code"}

Snippet = tuple[str, float, str]  # (text, difficulty or NaN, group: the task kind or "")


def numpy_sources(max_files: int, seed: int = 0) -> list[tuple[str, str]]:
    """Up to ``max_files`` (relative path, text) of numpy's non-test modules, in seeded hash order."""
    root = Path(np.__file__).parent
    files = [
        p
        for p in root.rglob("*.py")
        if not EXCLUDED_PARTS & set(p.relative_to(root).parts) and p.stat().st_size > 2_000
    ]
    if not files:
        raise FileNotFoundError(f"no numpy sources found under {root}")
    files.sort(key=lambda p: hashlib.sha256(f"{seed}:{p.relative_to(root)}".encode()).hexdigest())
    return [
        (f"numpy/{p.relative_to(root).as_posix()}", p.read_text(encoding="utf-8", errors="replace"))
        for p in files[:max_files]
    ]


def code_snippets(n: int, seed: int = 0) -> list[Snippet]:
    """Consecutive 12-line windows of numpy modules (non-blank), one per file in hash order."""
    out: list[Snippet] = []
    for rel, text in numpy_sources(4 * n, seed):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) < 40:
            continue
        start = random.Random(f"{seed}:{rel}").randrange(len(lines) - 12)
        out.append(("\n".join(lines[start : start + 12]), float("nan"), ""))
        if len(out) == n:
            break
    return out


def prose_snippets(n: int, seed: int = 777) -> list[Snippet]:
    """Word problems with their worked answers, from the corpus generators with an unused seed."""
    from tasks import reasoning  # the training data's generators, with a held-out seed

    rng = random.Random(f"census-prose:{seed}")
    out: list[Snippet] = []
    for _ in range(n):
        question, answer = rng.choice(reasoning.WORD_PROBLEMS)(rng)
        out.append((f"Question: {question}\nAnswer: {answer}", float("nan"), ""))
    return out


def plain_prose_snippets(n: int, seed: int = 778) -> list[Snippet]:
    """The same kind of word problem as bare sentences: no "Question:" / "Answer:" frame."""
    from tasks import reasoning

    rng = random.Random(f"census-plain:{seed}")
    return [(rng.choice(reasoning.WORD_PROBLEMS)(rng)[0], float("nan"), "") for _ in range(n)]


def arithmetic_snippets(n: int, seed: int = 9000) -> list[Snippet]:
    """Three solved held-out problems per snippet, digits 1-4 (the difficulty)."""
    from tasks import arithmetic

    out: list[Snippet] = []
    for i in range(n):
        digits = 1 + i % 4
        problems = arithmetic.make_problems(3, digits, seed + i, split="heldout")
        out.append(("\n".join(arithmetic.render(p, a) for p, a in problems), float(digits), ""))
    return out


def depth_snippets(n: int, seed: int = 5000) -> list[Snippet]:
    """Held-out depth tasks with answers, kinds in turn, levels 1 to two above the trained ones."""
    from tasks import depth

    out: list[Snippet] = []
    for i in range(n):
        kind = depth.KINDS[i % len(depth.KINDS)]
        level = 1 + (i // len(depth.KINDS)) % (depth.TRAIN_LEVELS[kind] + 2)
        task = depth.make_tasks(kind, 1, level, seed + i, split="heldout")[0]
        out.append((task.render(), float(level), kind))
    return out


HELDOUT: dict[str, Callable[[int], list[Snippet]]] = {
    "code": code_snippets,
    "prose": prose_snippets,
    "plain_prose": plain_prose_snippets,
    "arithmetic": arithmetic_snippets,
    "depth": depth_snippets,
}


def token_category(token: str, source: str) -> str:
    """digit / operator / punctuation / identifier / word / whitespace / special / mixed."""
    text = token.strip()
    if token.startswith("<|") and token.endswith("|>"):
        return "special"
    if not text:
        return "whitespace"
    if text.isdigit():
        return "digit"
    if set(text) <= OPERATORS:
        return "operator"
    if not any(c.isalnum() for c in text):
        return "punctuation"
    if all(c.isalnum() or c == "_" for c in text):
        if "_" in text or any(c.isdigit() for c in text) or source in CODE_SOURCES:
            return "identifier"
        if source == "depth" and len(text) <= 2:
            return "identifier"  # variable names in the code tasks, node names in the graphs
        return "word"
    return "mixed"
