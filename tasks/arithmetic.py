"""Graded arithmetic problems and answer parsing: one home for the training corpus and the workbench.

``make_problems(n, difficulty, seed)`` returns ``(prompt, answer)`` pairs such as ``("347 + 912 =",
"1259")``; the starter corpus trains on ``render(prompt, answer)`` == ``"347 + 912 = 1259"``, so an
evaluation prompts with ``prompt`` and reads the integer the model writes after it. ``difficulty`` is
the number of digits of each operand (1 = single digits).

Problems are split by a hash of their prompt: one in ``HELD_OUT_BUCKETS`` is held out. The starter corpus
draws only ``split="train"`` problems, so the default ``split="heldout"`` gives an evaluation that never
appeared verbatim in the arithmetic drills (it may still occur inside a word problem's worked answer).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KINDS = ("add", "mul", "sum")
MAX_DIFFICULTY = 12
SPLITS = ("heldout", "train", "any")
HELD_OUT_BUCKETS = 8


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


def is_held_out(prompt: str) -> bool:
    """Whether a problem belongs to the held-out split (a fixed 1/HELD_OUT_BUCKETS by prompt hash)."""
    return hashlib.sha256(prompt.encode()).digest()[0] % HELD_OUT_BUCKETS == 0


def make_problems(
    n: int, difficulty: int, seed: int, kinds: Sequence[str] = KINDS, split: str = "heldout"
) -> list[tuple[str, str]]:
    """``n`` deterministic (prompt, answer) pairs of ``split``, kinds drawn uniformly from ``kinds``.

    Sampling is with replacement, so the few held-out one-digit problems can repeat.
    """
    if not 1 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be in 1..{MAX_DIFFICULTY}, got {difficulty}")
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if not kinds:
        raise ValueError("kinds is empty")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    rng = random.Random(f"arithmetic:{seed}:{difficulty}")
    problems: list[tuple[str, str]] = []
    while len(problems) < n:
        prompt, answer = make_problem(rng, difficulty, rng.choice(list(kinds)))
        if split == "any" or is_held_out(prompt) == (split == "heldout"):
            problems.append((prompt, answer))
    return problems


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


def is_correct(generated: str, answer: str) -> bool:
    """The generated text starts with the answer and the number ends there."""
    text = generated.strip()
    return text.startswith(answer) and not text[len(answer) : len(answer) + 1].isdigit()


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


def arithmetic_problems(
    n: int, seed: int = 0, max_operand: int = 99, ops: str = "+-"
) -> list[Problem]:
    """``n`` prompts "a + b = " / "a - b = " with operands in [0, max_operand] (fixed seed)."""
    rng = np.random.default_rng(seed)
    problems = []
    for _ in range(n):
        a, b = (int(v) for v in rng.integers(0, max_operand + 1, size=2))
        op = ops[int(rng.integers(len(ops)))]
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        problems.append(Problem(f"{a} {op} {b} = ", str(value)))
    return problems


@dataclass(frozen=True)
class PromptPair:
    """A clean prompt and a corrupted one that differ in one operand, so their answers differ."""

    clean: str
    corrupted: str
    answer: str
    corrupted_answer: str


def corrupted_operand_pair(a: int, b: int, corrupted_b: int) -> PromptPair:
    """ "a + b = " against "a + corrupted_b = ": same length in characters (single-digit operands)
    and different one-digit answers, so the answer is one token and the prompts align token by
    token. The trailing space is part of the prompt: the model's next token is the answer's digit."""
    operands = (a, b, corrupted_b)
    if any(not 0 <= x <= 9 for x in operands):
        raise ValueError(f"operands must be single digits, got {operands}")
    if a + b > 9 or a + corrupted_b > 9:
        raise ValueError(f"{a} + {b} and {a} + {corrupted_b} must both be below 10 (one digit)")
    if b == corrupted_b:
        raise ValueError(f"the corrupted operand must differ from {b}")
    return PromptPair(f"{a} + {b} = ", f"{a} + {corrupted_b} = ", str(a + b), str(a + corrupted_b))


# The interventions' default experiment: the operand 4 → 2 turns the answer 7 into 5.
DEFAULT_PATCHING_PAIR = corrupted_operand_pair(3, 4, 2)
