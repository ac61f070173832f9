"""The embedded starter corpus and the arithmetic generator used for held-out evaluation."""

import re

import pytest

from pretrain.data import DataConfig, prepare_data
from pretrain.data.config import DataError
from pretrain.data.starter_corpus import SIZES, split_source, starter_documents, stdlib_documents
from recurrent_model.tokenizer import BEGIN_HEADER, END_HEADER, END_TURN
from tasks.arithmetic import is_held_out, make_problems, parse_answer, render
from tasks.depth import KINDS


@pytest.mark.parametrize("difficulty", [1, 3, 6])
def test_arithmetic_answers_are_correct_and_graded(difficulty):
    problems = make_problems(60, difficulty, seed=7)
    assert len(problems) == 60 and problems == make_problems(60, difficulty, seed=7)
    assert problems != make_problems(60, difficulty, seed=8)
    kinds = set()
    for prompt, answer in problems:
        assert prompt.endswith(" =")
        expression = prompt[:-2]
        assert eval(expression, {"__builtins__": {}}) == int(answer)  # noqa: S307
        operands = re.findall(r"\d+", expression)
        assert all(len(o) == difficulty for o in operands)
        kinds.add("*" if "*" in expression else f"+{len(operands) > 2}")
        assert parse_answer(" " + answer + "\n3 + 4 = 7") == int(answer)
    assert kinds == {"*", "+False", "+True"}  # products, sums of two, multi-operand sums


def test_held_out_problems_never_appear_in_the_starter_drills():
    drills = set()
    for doc in starter_documents("tiny", seed=0):
        if doc.kind == "arithmetic":
            drills.update(line.rsplit(" = ", 1)[0] + " =" for line in doc.text.splitlines())
    assert len(drills) > 500
    assert not any(is_held_out(p) for p in drills)
    held_out = make_problems(400, 1, seed=0) + make_problems(400, 2, seed=0)
    assert all(is_held_out(p) for p, _ in held_out)
    assert not {p for p, _ in held_out} & drills
    assert not any(is_held_out(p) for p, _ in make_problems(50, 2, seed=0, split="train"))


def test_arithmetic_rejects_bad_arguments():
    with pytest.raises(ValueError, match="difficulty"):
        make_problems(3, 0, seed=0)
    with pytest.raises(ValueError, match="split must be"):
        make_problems(3, 2, seed=0, split="test")
    with pytest.raises(ValueError, match="unknown arithmetic kind"):
        make_problems(3, 2, seed=0, kinds=("div",))
    assert render("2 + 2 =", "4") == "2 + 2 = 4"
    assert parse_answer("no digits") is None


STARTER_KINDS = {
    "stdlib", "arithmetic", "word_problems", "counting", "modular", "chat",
    *(f"depth_{k}" for k in KINDS),
}  # fmt: skip


def test_starter_is_deterministic_and_mixed():
    docs = starter_documents("tiny", seed=0)
    assert docs == starter_documents("tiny", seed=0)
    assert docs != starter_documents("tiny", seed=1)
    kinds = {d.kind for d in docs}
    assert kinds == STARTER_KINDS
    chat = next(d.text for d in docs if d.kind == "chat")
    assert re.fullmatch(
        rf"{re.escape(BEGIN_HEADER)}user{re.escape(END_HEADER)}\n\n.+{re.escape(END_TURN)}"
        rf"{re.escape(BEGIN_HEADER)}Huginn{re.escape(END_HEADER)}\n\n.+{re.escape(END_TURN)}",
        chat,
        flags=re.S,
    )
    word = next(d.text for d in docs if d.kind == "word_problems")
    assert word.startswith("Question: ") and "\nAnswer: " in word and "\n#### " in word
    code = next(d.text for d in docs if d.kind == "stdlib")
    assert code.startswith("# Lib/") and code.count("\n") > 1


def test_word_problem_worked_answers_add_up():
    checked = 0
    for doc in starter_documents("tiny", seed=0):
        if doc.kind in ("word_problems", "modular", "chat"):
            for lhs, rhs in re.findall(r"(\d+(?: [-+*] \d+)+) = \$?(\d+)", doc.text):
                assert eval(lhs, {"__builtins__": {}}) == int(rhs), doc.text  # noqa: S307
                checked += 1
    assert checked > 200


def test_split_source_keeps_decorators_with_definitions():
    source = "import os\n\n@decorator\ndef f():\n    pass\n\nclass A:\n    x = 1\n"
    assert split_source(source, max_chars=10) == [
        "import os\n\n",
        "@decorator\ndef f():\n    pass\n\n",
        "class A:\n    x = 1\n",
    ]
    assert "".join(split_source(source, max_chars=1000)) == source


def test_unknown_size_is_an_error():
    with pytest.raises(DataError, match="starter size"):
        starter_documents("huge", seed=0)


@pytest.mark.slow
def test_prepare_starter_records_hash_and_stats(tmp_path):
    config = DataConfig(starter_size="tiny", vocab_size=512, block_size=64, seed=0)
    prepared = prepare_data(config, tmp_path, progress=False)
    assert re.fullmatch(r"[0-9a-f]{64}", prepared.corpus_hash)
    kinds = prepared.stats["docs_per_kind"]
    assert set(kinds) == {f"starter:{k}" for k in STARTER_KINDS}
    assert prepared.train_rows > 500 and prepared.val_rows > 10
    other = prepare_data(
        DataConfig(starter_size="tiny", vocab_size=512, block_size=64, seed=1),
        tmp_path / "s1",
        progress=False,
    )
    assert other.corpus_hash != prepared.corpus_hash


@pytest.mark.slow
def test_medium_keeps_every_stdlib_file_and_is_mostly_code():
    docs = starter_documents("medium", seed=0)
    code = [d for d in docs if d.kind == "stdlib"]
    assert sorted(d.text for d in code) == sorted(d.text for d in stdlib_documents(0, None))
    code_chars = sum(len(d.text) for d in code)
    assert code_chars > 0.5 * sum(len(d.text) for d in docs)
    assert len(docs) - len(code) == SIZES["medium"].reasoning_docs
