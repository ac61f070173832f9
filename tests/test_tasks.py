"""The shared task package: depth tasks are deterministic, correct (code executed), graded and split."""

import contextlib
import io
import re

import pytest

from tasks import arithmetic, depth
from tasks.depth import KINDS, TRAIN_LEVELS, make_tasks

SAFE_BUILTINS = {"print": print}


def run_snippet(prompt: str) -> str:
    """Execute a code task's prompt (no builtins but print) and return what it printed."""
    code = prompt.removesuffix("# output:")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"__builtins__": SAFE_BUILTINS})  # noqa: S102 - generated, restricted namespace
    return out.getvalue().strip()


def reachable(prompt: str) -> tuple[bool, int | None]:
    """Independent BFS over the prompt's edge list: (reachable, shortest path length)."""
    edges = re.findall(r"([A-Z])->([A-Z])", prompt)
    target, start = re.search(r"reach ([A-Z]) from ([A-Z])\?", prompt).groups()
    frontier, dist = [start], {start: 0}
    while frontier:
        node = frontier.pop(0)
        for s, t in edges:
            if s == node and t not in dist:
                dist[t] = dist[node] + 1
                frontier.append(t)
    return target in dist, dist.get(target)


@pytest.mark.parametrize("kind", KINDS)
def test_generators_are_deterministic_by_seed(kind):
    assert make_tasks(kind, 5, 3, seed=7) == make_tasks(kind, 5, 3, seed=7)
    assert make_tasks(kind, 5, 3, seed=7) != make_tasks(kind, 5, 3, seed=8)


@pytest.mark.parametrize("level", [1, 2, 4, 7, 10])
def test_code_tasks_print_their_answer(level):
    for kind in ("variables", "list_ops"):
        for task in make_tasks(kind, 20, level, seed=level, split="any"):
            assert run_snippet(task.prompt) == task.answer, task.prompt
            assert task.render() == f"{task.prompt} {task.answer}"


def test_variables_need_level_hops():
    task = make_tasks("variables", 1, 5, seed=0)[0]
    lines = {
        ln.split(" = ")[0]: ln.split(" = ")[1] for ln in task.prompt.splitlines() if " = " in ln
    }
    name, hops = re.search(r"print\((\w)\)", task.prompt).group(1), 0
    while not lines[name].isdigit():
        name, hops = lines[name].split()[0], hops + 1
    assert hops == 5
    assert len(task.prompt.splitlines()) == 5 + 1 + 5 // 2 + 2  # chain, distractors, print, output


@pytest.mark.parametrize("level", [1, 3, 6, 9])
def test_carry_chain_has_level_carries(level):
    for task in make_tasks("carries", 20, level, seed=1, split="any"):
        a, b = map(int, re.match(r"(\d+) \+ (\d+) =", task.prompt).groups())
        assert int(task.answer) == a + b
        carry, carries = 0, 0
        for x, y in zip(reversed(str(a)), reversed(str(b)), strict=True):
            carry = (int(x) + int(y) + carry) // 10
            carries += carry
        assert carries == level and len(str(a)) == len(str(b)) == level + 1


@pytest.mark.parametrize("level", [1, 3, 6])
def test_reachability_answers_and_path_length(level):
    tasks = make_tasks("reachability", 200, level, seed=2, split="any")
    answers = []
    for task in tasks:
        ok, length = reachable(task.prompt)
        assert task.answer == ("yes" if ok else "no")
        if ok:
            assert length == level
        answers.append(task.answer)
    assert 0.4 < answers.count("yes") / len(answers) < 0.6


def test_splits_are_disjoint_and_harder_levels_held_out():
    for kind in KINDS:
        top = TRAIN_LEVELS[kind]
        train = {t.prompt for t in make_tasks(kind, 200, 2, seed=0, split="train")}
        held = {t.prompt for t in make_tasks(kind, 30, 2, seed=0, split="heldout")}
        assert train and held and not train & held
        assert all(depth.is_held_out(t) for t in make_tasks(kind, 5, top + 1, seed=0))
        with pytest.raises(ValueError, match="above the trained levels"):
            make_tasks(kind, 1, top + 1, seed=0, split="train")


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="unknown depth task"):
        make_tasks("sorting", 1, 1, seed=0)
    with pytest.raises(ValueError, match="level must be"):
        make_tasks("variables", 1, 0, seed=0)
    with pytest.raises(ValueError, match="split must be"):
        make_tasks("variables", 1, 1, seed=0, split="test")


def test_arithmetic_answer_checks_agree():
    assert arithmetic.is_correct(" 12 and", "12") and not arithmetic.is_correct("123", "12")
    assert arithmetic.parse_answer(" -42\n") == -42
    problems = arithmetic.arithmetic_problems(10, seed=3)
    for p in problems:
        assert eval(p.prompt.removesuffix("= "), {"__builtins__": {}}) == int(p.answer)  # noqa: S307


def test_corrupted_operand_pair_changes_the_one_digit_answer() -> None:
    from tasks.arithmetic import DEFAULT_PATCHING_PAIR, corrupted_operand_pair

    pair = corrupted_operand_pair(3, 4, 2)
    assert pair == DEFAULT_PATCHING_PAIR
    assert (pair.clean, pair.corrupted) == ("3 + 4 = ", "3 + 2 = ")
    assert (pair.answer, pair.corrupted_answer) == ("7", "5")
    assert len(pair.clean) == len(pair.corrupted)
    for bad, message in (((3, 4, 4), "differ"), ((5, 6, 1), "below 10"), ((3, 12, 2), "single")):
        with pytest.raises(ValueError, match=message):
            corrupted_operand_pair(*bad)
