"""The census summaries (workbench.corpus.summary) and token categories, on a frame with known
answers; eval/census.py is the corpus engine run on the held-out sets."""

import pandas as pd
import pytest

from workbench.corpus import token_category
from workbench.corpus.summary import period_histogram, runs_by_orbit_share, shares


@pytest.mark.parametrize(
    ("token", "source", "category"),
    [
        (" 42", "arithmetic", "digit"), (" +", "arithmetic", "operator"), ("==", "code", "operator"),
        ("):", "code", "punctuation"), (" self", "code", "identifier"), (" eggs", "prose", "word"),
        (" x1", "prose", "identifier"), (" b", "depth", "identifier"), ("\n  ", "code", "whitespace"),
        ("<|begin_text|>", "prose", "special"), (" 3rd.", "prose", "mixed"),
    ],
)  # fmt: skip
def test_token_category(token, source, category):
    assert token_category(token, source) == category


def frame() -> pd.DataFrame:
    """Two code runs (one all orbits from position 1, one all fixed, one of them still converging)
    and one prose run, 4 tokens each."""
    rows = []
    for prompt, kinds in (
        ("c0", ["fixed_point", "orbit", "orbit", "orbit"]),
        ("c1", ["fixed_point"] * 4),
    ):
        for pos, kind in enumerate(kinds):
            rows.append(("code", prompt, 0, pos, f"t{pos}", kind, 2.0 if kind == "orbit" else None))
    for pos in range(4):
        rows.append(("prose", "p0", 0, pos, " w", "fixed_point", None))
    out = pd.DataFrame(
        rows, columns=["source", "prompt_id", "seed", "position", "token", "kind", "period"]
    )
    out["group"] = out["source"]
    out["flip"] = out["kind"] == "orbit"
    out["settled"] = out["kind"] == "fixed_point"
    out.loc[4, "settled"] = False  # c1's first token has not settled yet
    out["final_step_size"] = [0.05 if k == "orbit" else 1e-7 for k in out["kind"]]
    out["category"] = "word"
    return out


def test_shares_runs_and_periods():
    f = frame()
    overall = shares(f, None).iloc[0]
    assert overall["orbit"] == pytest.approx(3 / 12) and overall["tokens"] == 12
    assert overall["converging"] == pytest.approx(1 / 12)
    by_source = shares(f, "source")
    assert by_source.loc["code", "orbit"] == pytest.approx(3 / 8)
    assert by_source.loc["code", "converging"] == pytest.approx(1 / 8)
    assert (
        by_source.loc["prose", "fixed_point"] == 1.0 and by_source.loc["prose", "converging"] == 0
    )
    runs = runs_by_orbit_share(f)
    assert runs.loc["code", ">80%"] == 0.0 and runs.loc["code", "20-80%"] == 0.5
    assert runs.loc["code", "none"] == 0.5 and runs.loc["prose", "none"] == 1.0
    assert runs.loc["code", "median_first_orbit_position"] == 1
    assert period_histogram(f).to_dict() == {2: 3}
