"""Tasks whose answer needs a number of sequential steps that the generator controls (the *level*).

Four kinds, each a function ``(rng, level) -> Task``:

- ``variables``: multi-hop variable chasing in code (``a = 3`` / ``b = a + 4`` / ``c = b * 2`` /
  ``print(c)``); level = hops from the literal to the printed variable, with distractor assignments;
- ``carries``: multi-digit addition whose carry ripples through ``level`` columns;
- ``list_ops``: ``level`` list or string operations applied in turn in code, then ``print``;
- ``reachability``: is node Y reachable from node X in a small directed graph; for "yes" the shortest
  path has ``level`` edges.

A task renders as ``prompt + " " + answer``; code prompts end with ``# output:``, the graph prompt with
``Answer:``, so an evaluation prompts with ``prompt`` and compares what the model writes next.

Splits: levels ``1..TRAIN_LEVELS[kind]`` are trained; harder levels are held out whole (``split="train"``
never yields them); at trained levels a fixed 1/HELD_OUT_BUCKETS of instances (by prompt hash) is held
out, so ``split="heldout"`` at a trained level gives instances that never appear in training.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

HELD_OUT_BUCKETS = 8
SPLITS = ("heldout", "train", "any")
MAX_LEVEL = 16
_VARIABLES = tuple(string.ascii_lowercase)
_NODES = tuple(string.ascii_uppercase)


@dataclass(frozen=True)
class Task:
    """One generated problem: ``prompt`` (ends where the answer starts), ``answer``, ``kind``, ``level``."""

    prompt: str
    answer: str
    kind: str
    level: int

    def render(self) -> str:
        """The training form: prompt, one space, answer."""
        return f"{self.prompt} {self.answer}"


def _apply(value: int, op: str, operand: int) -> int:
    return {"+": value + operand, "-": value - operand, "*": value * operand}[op]


def variables(rng: random.Random, level: int) -> Task:
    """``level`` hops of variable chasing with ``level // 2`` distractors, values kept in [0, 99]."""
    names = rng.sample(_VARIABLES, level + 1 + level // 2)
    chain, distractors = names[: level + 1], names[level + 1 :]
    value = rng.randint(0, 9)
    lines = [f"{chain[0]} = {value}"]
    for prev, name in zip(chain, chain[1:], strict=False):
        op = rng.choice("+-*" if value < 30 else "+-")
        operand = rng.randint(2, 3) if op == "*" else rng.randint(1, 9)
        if op == "-" and operand > value:
            op = "+"
        value = _apply(value, op, operand)
        lines.append(f"{name} = {prev} {op} {operand}")
    for name in distractors:  # assignments the answer does not depend on, at random places
        source = rng.choice(lines).split(" = ")[0]
        at = rng.randint(1, len(lines))
        at = max(at, next(i for i, line in enumerate(lines) if line.startswith(f"{source} =")) + 1)
        lines.insert(at, f"{name} = {source} + {rng.randint(1, 9)}")
    prompt = "\n".join([*lines, f"print({chain[-1]})", "# output:"])
    return Task(prompt, str(value), "variables", level)


def carries(rng: random.Random, level: int) -> Task:
    """a + b with ``level + 1`` digits each where a carry ripples through ``level`` columns."""
    digits = level + 1
    a_digits, b_digits = [], []
    for column in range(digits):  # least significant first
        if column == 0:
            x = rng.randint(1, 9)
            y = rng.randint(10 - x, 9)  # starts the carry
        elif column < level:
            x = rng.randint(0, 9)
            y = 9 - x  # x + y + 1 = 10: passes the carry on
        else:
            x = rng.randint(1, 7)
            y = rng.randint(1, 8 - x)  # the leading column absorbs it (x + y + 1 <= 9)
        a_digits.append(x)
        b_digits.append(y)
    if rng.random() < 0.5:
        a_digits, b_digits = b_digits, a_digits
    a = int("".join(map(str, reversed(a_digits))))
    b = int("".join(map(str, reversed(b_digits))))
    return Task(f"{a} + {b} =", str(a + b), "carries", level)


_LIST_OPS: tuple[tuple[str, Callable[[list, random.Random], tuple[str, list]]], ...] = (
    ("reverse", lambda x, r: ("x = x[::-1]", x[::-1])),
    ("rotate", lambda x, r: ("x = x[1:] + x[:1]", x[1:] + x[:1])),
    ("drop", lambda x, r: ("x = x[1:]", x[1:])),
)


def _list_step(x: list, rng: random.Random, is_str: bool) -> tuple[str, list]:
    pick = rng.randrange(5 if not is_str else 4)
    if pick < len(_LIST_OPS) and (pick != 2 or len(x) > 2):
        return _LIST_OPS[pick][1](x, rng)
    if pick == 3 or pick == 2:
        if is_str:
            ch = rng.choice("xyz")
            return f"x = x + {ch!r}", x + [ch]
        k = rng.randint(0, 9)
        return f"x = x + [{k}]", x + [k]
    k = rng.randint(1, 5)
    return f"x = [v + {k} for v in x]", [v + k for v in x]


def list_ops(rng: random.Random, level: int) -> Task:
    """``level`` operations on a short list of digits or a short string, then ``print(x)``."""
    is_str = rng.random() < 0.4
    if is_str:
        x: list = list(rng.sample("abcdefgh", rng.randint(3, 5)))
        lines = [f"x = {''.join(x)!r}"]
    else:
        x = [rng.randint(0, 9) for _ in range(rng.randint(3, 5))]
        lines = [f"x = {x}"]
    for _ in range(level):
        line, x = _list_step(x, rng, is_str)
        lines.append(line)
    answer = "".join(x) if is_str else str(x)
    return Task("\n".join([*lines, "print(x)", "# output:"]), answer, "list_ops", level)


def reachability(rng: random.Random, level: int) -> Task:
    """Directed graph in words; half the questions are reachable with a shortest path of ``level``."""
    nodes = rng.sample(_NODES, 2 * level + 4)
    path, others = nodes[: level + 1], nodes[level + 1 :]
    edges = list(zip(path, path[1:], strict=False))
    reachable = rng.random() < 0.5
    target = path[-1] if reachable else others[0]
    if reachable:  # decoys lead off the path into other nodes, never back onto it
        for node in others:
            source = rng.choice(path[:-1] + others)
            if source != node:
                edges.append((source, node))
    else:  # the target is entered only from a node nothing enters
        edges.append((others[1], target))
        edges.append((target, rng.choice(path[1:])))
        for node in others[2:]:
            source = rng.choice(path + others[2:])
            if source != node:
                edges.append((source, node))
    rng.shuffle(edges)
    edge_text = ", ".join(f"{s}->{t}" for s, t in edges)
    prompt = f"Edges: {edge_text}. Can you reach {target} from {path[0]}?\nAnswer:"
    answer = "yes" if _reaches(edges, path[0], target) else "no"
    return Task(prompt, answer, "reachability", level)


def _reaches(edges: list[tuple[str, str]], start: str, target: str) -> bool:
    seen, frontier = {start}, [start]
    while frontier:
        node = frontier.pop()
        for s, t in edges:
            if s == node and t not in seen:
                seen.add(t)
                frontier.append(t)
    return target in seen


GENERATORS: dict[str, Callable[[random.Random, int], Task]] = {
    "variables": variables,
    "carries": carries,
    "list_ops": list_ops,
    "reachability": reachability,
}
KINDS = tuple(GENERATORS)
TRAIN_LEVELS = {"variables": 6, "carries": 6, "list_ops": 5, "reachability": 5}


def is_held_out(task: Task) -> bool:
    """Held out: every task above the trained levels, and 1/HELD_OUT_BUCKETS of the rest by hash."""
    if task.level > TRAIN_LEVELS[task.kind]:
        return True
    return hashlib.sha256(task.prompt.encode()).digest()[0] % HELD_OUT_BUCKETS == 0


def make_tasks(kind: str, n: int, level: int, seed: int, split: str = "heldout") -> list[Task]:
    """``n`` deterministic tasks of ``kind`` at ``level`` from ``split`` ("heldout", "train", "any")."""
    if kind not in GENERATORS:
        raise ValueError(f"unknown depth task {kind!r}; choose from {', '.join(KINDS)}")
    if not 1 <= level <= MAX_LEVEL:
        raise ValueError(f"level must be in 1..{MAX_LEVEL}, got {level}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "train" and level > TRAIN_LEVELS[kind]:
        raise ValueError(
            f"{kind} level {level} is above the trained levels 1..{TRAIN_LEVELS[kind]}: "
            "it has no train split"
        )
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    rng = random.Random(f"depth:{kind}:{seed}:{level}")
    tasks: list[Task] = []
    for _ in range(1000 * max(n, 1)):
        if len(tasks) == n:
            break
        task = GENERATORS[kind](rng, level)
        if split == "any" or is_held_out(task) == (split == "heldout"):
            tasks.append(task)
    return tasks


def training_level(rng: random.Random, kind: str) -> int:
    """A trained level for ``kind``, easier levels more often (min of two uniform draws)."""
    top = TRAIN_LEVELS[kind]
    return min(rng.randint(1, top), rng.randint(1, top))
