"""Graded arithmetic problems, importable on their own for held-out evaluation.

``make_problems(n, difficulty, seed)`` returns ``(prompt, answer)`` pairs such as ``("347 + 912 =",
"1259")``; the starter corpus trains on ``render(prompt, answer)`` == ``"347 + 912 = 1259"``, so an
evaluation prompts with ``prompt`` and reads the integer the model writes after it. ``difficulty`` is
the number of digits of each operand (1 = single digits).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

KINDS = ("add", "mul", "sum")
MAX_DIFFICULTY = 12


def _operand(rng: random.Random, digits: int) -> int:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def make_problem(rng: random.Random, difficulty: int, kind: str) -> tuple[str, str]:
    """One problem of ``kind`` ("add", "mul" or "sum" of 3-5 operands) with d-digit operands."""
    if kind == "add":
        a, b = _operand(rng, difficulty), _operand(rng, difficulty)
        return f"{a} + {b} =", str(a + b)
    if kind == "mul":
        a, b = _operand(rng, difficulty), _operand(rng, difficulty)
        return f"{a} * {b} =", str(a * b)
    if kind == "sum":
        terms = [_operand(rng, difficulty) for _ in range(rng.randint(3, 5))]
        return " + ".join(map(str, terms)) + " =", str(sum(terms))
    raise ValueError(f"unknown arithmetic kind {kind!r}; choose from {', '.join(KINDS)}")


def make_problems(
    n: int, difficulty: int, seed: int, kinds: Sequence[str] = KINDS
) -> list[tuple[str, str]]:
    """``n`` deterministic (prompt, answer) pairs, kinds drawn uniformly from ``kinds``."""
    if not 1 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be in 1..{MAX_DIFFICULTY}, got {difficulty}")
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if not kinds:
        raise ValueError("kinds is empty")
    rng = random.Random(f"arithmetic:{seed}:{difficulty}")
    return [make_problem(rng, difficulty, rng.choice(list(kinds))) for _ in range(n)]


def render(prompt: str, answer: str) -> str:
    """The training form of a problem: ``"347 + 912 = 1259"``."""
    return f"{prompt} {answer}"


def parse_answer(generated: str) -> int | None:
    """The first integer in model output (after the prompt), or None."""
    token = ""
    for ch in generated.lstrip():
        if ch.isdigit() or (ch == "-" and not token):
            token += ch
        else:
            break
    try:
        return int(token)
    except ValueError:
        return None
