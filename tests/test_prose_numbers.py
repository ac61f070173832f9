"""The prose-number check fails on a sentence its values contradict, and on a number with no source."""

from __future__ import annotations

from prose_numbers import Quote, check, normalise, numbers

# The stability notebook's sentence against the count its output printed.
CONTRADICTION = "Plain iteration does not reach the 1e-5 tolerance within 500 passes."


def test_a_contradicted_bound_fails():
    quotes = [Quote("the 1e-5 tolerance within 500 passes", ("tol", "plain"))]
    problems = check(CONTRADICTION, quotes, {"tol": 1e-5, "plain": 428}.__getitem__)
    assert len(problems) == 1 and "500" in problems[0] and "428" in problems[0]
    assert check(CONTRADICTION, quotes, {"tol": 1e-5, "plain": 742.0}.__getitem__) == []


def test_a_number_without_a_quote_fails():
    problems = check("Anderson needs 22 passes; plain iteration 317.", [Quote("22 passes", ("a",))],
                     {"a": 22}.__getitem__)  # fmt: skip
    assert problems == [problems[0]] and "'317' has no source" in problems[0]


def test_each_relation_reads_its_words():
    values = {"x": 0.4469, "y": -0.0616, "r": 14.4}.__getitem__
    ok = "stretches about +0.45, the first about −0.06, more than 10 times as many, 0.447 exactly."
    quotes = [Quote("about +0.45", ("x",)), Quote("about −0.06", ("y",)),
              Quote("more than 10 times", ("r",)), Quote("0.447 exactly", ("x",))]  # fmt: skip
    assert check(ok, quotes, values) == []
    wrong = ok.replace("+0.45", "+0.47").replace("more than", "less than").replace("0.447", "0.44")
    wrong_quotes = [Quote(q.snippet.replace("+0.45", "+0.47").replace("more than", "less than")
                          .replace("0.447", "0.44"), q.values) for q in quotes]  # fmt: skip
    assert len(check(wrong, wrong_quotes, values)) == 3


def test_names_and_code_are_not_numbers():
    text = normalise(
        "λ_1 of s_0, a period-2 flip, 3-cycles, 2π, the 2.6M model, `core.1.attn` and\n\n    x = 3\n"
    )
    assert numbers(text) == []
    assert [f.value for f in numbers(normalise("−0.05 ± 0.002 at 1e-5 and 8.5 %"))] == [
        -0.05,
        0.002,
        1e-5,
        8.5,
    ]
    assert [f.value for f in numbers("38,178 rows, pairs (1,2), (3,4)")] == [38178, 1, 2, 3, 4]


def test_a_quote_missing_from_the_prose_fails():
    assert check("nothing here", [Quote("about 3 passes", ("a",))], {"a": 3}.__getitem__) == [
        "not in the prose: 'about 3 passes'"
    ]


def test_a_negation_reaches_only_its_own_clause():
    text = (
        "Its level is not comparable with the loss on these texts (above 3 nats), at the end 16 %."
    )
    quotes = [Quote("(above 3 nats)", ("loss",)), Quote("16 %", ("gain",))]
    assert check(text, quotes, {"loss": 3.2, "gain": 16.4}.__getitem__) == []
    assert check(
        "It never gets within 500 passes.", [Quote("within 500", ("p",))], {"p": 317}.__getitem__
    )
