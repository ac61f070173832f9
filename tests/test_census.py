"""eval/census.py: token categories and the census summaries, on a frame with known answers."""

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

EVAL = Path(__file__).resolve().parents[1] / "eval"
sys.path.insert(0, str(EVAL))
spec = importlib.util.spec_from_file_location("census", EVAL / "census.py")
census = importlib.util.module_from_spec(spec)
spec.loader.exec_module(census)


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
    assert census.token_category(token, source) == category


def frame() -> pd.DataFrame:
    """Two code runs (one all orbits from position 1, one all fixed) and one prose run, 4 tokens each."""
    rows = []
    for snippet, kinds in (
        (0, ["fixed_point", "orbit", "orbit", "orbit"]),
        (1, ["fixed_point"] * 4),
    ):
        for pos, kind in enumerate(kinds):
            rows.append(
                ("code", snippet, 0, pos, f"t{pos}", kind, 2.0 if kind == "orbit" else None)
            )
    for pos in range(4):
        rows.append(("prose", 0, 0, pos, " w", "fixed_point", None))
    out = pd.DataFrame(
        rows, columns=["source", "snippet", "seed", "position", "token", "kind", "period"]
    )
    out["flip"] = out["kind"] == "orbit"
    out["final_step_size"] = [0.05 if k == "orbit" else 1e-7 for k in out["kind"]]
    out["category"] = "word"
    return out


def test_shares_and_snippet_table():
    f = frame()
    overall = census.shares(f, None).iloc[0]
    assert overall["orbit"] == pytest.approx(3 / 12) and overall["tokens"] == 12
    by_source = census.shares(f, "source")
    assert by_source.loc["code", "orbit"] == pytest.approx(3 / 8)
    assert by_source.loc["prose", "fixed_point"] == 1.0
    runs = census.snippet_orbit_shares(f)
    assert runs.loc["code", ">80%"] == 0.0 and runs.loc["code", "20-80%"] == 0.5
    assert runs.loc["code", "none"] == 0.5 and runs.loc["prose", "none"] == 1.0
    assert runs.loc["code", "median_first_orbit_position"] == 1


def test_summary_counts_periods_and_agreement():
    summary = census.summarise(frame())
    assert summary["tokens"] == 12 and summary["snippets"] == 3
    assert summary["orbit_period_histogram"] == {"2": 3}
    assert summary["kind_agrees_across_seeds"] == 1.0
