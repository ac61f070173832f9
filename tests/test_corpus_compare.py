"""Corpus runs compared: the printed table names both runs and gives each difference with its
bootstrap interval over prompts, only shared prompts are paired (the others counted), the values
are the summaries' numbers, other tokenizers are compared per prompt text, a directory that is not
a run is refused in one line, and every figure draws (a note when its table is empty)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench import corpus
from workbench.corpus.__main__ import main
from workbench.corpus.analyses import Settings
from workbench.corpus.compare import _weighted_quantile, format_comparison
from workbench.corpus.engine import Job
from workbench.figures import compare as figures

PROMPTS = [
    "def f(x): return x + 1",
    "12 + 7 = 19",
    "The cat sat on the mat today",
    "x = 3; y = x * 2",
    "a b c",
]
EXTRA = "How many dozens of eggs will she eat in 4 weeks?"


@pytest.fixture(scope="module")
def runs(shipped_model, tmp_path_factory) -> tuple[Path, Path]:
    """Run A: 16 steps on PROMPTS; run B: 48 steps on PROMPTS and one more; lens at steps 1 and 8
    in both. Both read a file named p.txt, so shared prompts have the same ids."""
    root = tmp_path_factory.mktemp("compare")
    out = []
    for name, steps, prompts in (("r16", 16, PROMPTS), ("r48", 48, [*PROMPTS, EXTRA])):
        data = root / name / "p.txt"
        data.parent.mkdir()
        data.write_text("\n".join(prompts) + "\n", encoding="utf-8")
        settings = Settings(steps, (0, 1), ("dynamics", "lens"), (1, 8))
        job = Job(str(data), settings, unit_tokens=32)
        out.append(corpus.run(shipped_model, job, root / "runs" / name, progress=False))
    return out[0], out[1]


def _edited_copy(run: Path, out: Path, edit) -> Path:
    """A copy of ``run`` whose token parts went through ``edit(frame) -> frame``."""
    shutil.copytree(run, out)
    for part in (out / "tokens").glob("part-*.parquet"):
        edit(pd.read_parquet(part)).to_parquet(part)
    return out


def test_compare_prints_both_runs_and_each_difference_with_its_interval(runs, capsys):
    a, b = runs
    assert main(["compare", str(a), str(b), "--bootstrap", "200"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| r16 +\| small +\| +16 \| 0,1 ", out, re.M)  # name, model, steps, seeds
    assert re.search(r"^\| r48 +\| small +\| +48 \| 0,1 ", out, re.M)
    assert "r48 vs r16: 5 prompts in both; 0 prompts only in r16, 1 only in r48." in out
    assert "Δ r48 − r16 [95%]" in out and "KL at step 8" in out
    assert "λ_1: not in every run" in out  # neither run has the stability analysis
    assert "resampling unit is the prompt" in out and "200 resamples" in out
    row = next(line for line in out.splitlines() if re.match(r"\| all +\| settled", line))
    assert row.count("[") == 1 and row.rstrip(" |").endswith("]")  # Δ [low, high]


def test_only_shared_prompts_are_paired_and_the_values_are_the_summaries(runs):
    a, b = runs
    frames = corpus.compare([a, b], n_boot=300)
    pairs = frames["pairs"].iloc[0]
    assert (pairs.shared, pairs.only_a, pairs.only_b, pairs.unit) == (5, 0, 1, "token")
    assert list(frames["runs"]["run"]) == ["r16", "r48"]
    assert list(frames["runs"]["num_steps"]) == [16, 48]
    # run A holds only shared prompts: its values are its summary's
    tables = corpus.summary(a)
    kinds = frames["kinds"].query("run == 'r16' and group == 'all'").set_index("statistic")
    overall = tables["overall"].iloc[0]
    expected = {"settled": overall.fixed_point - overall.converging, "converging": overall.converging,
                "orbit": overall.orbit, "slider": overall.slider, "other": overall.other}  # fmt: skip
    for name, value in expected.items():
        assert kinds.loc[name, "value"] == pytest.approx(value, abs=1e-12)
    steps = frames["steps"].query("run == 'r16'").set_index("statistic")["value"]
    for name in ("median", "q25", "q75", "never"):
        assert steps[name] == pytest.approx(tables["steps_by_source"].loc["p", name], abs=1e-12)
    # run B's values count only the 5 shared prompts, not its extra one
    rows_b = corpus.load(b)
    shared = rows_b[rows_b["prompt_id"].isin(corpus.load(a)["prompt_id"])]
    assert shared["prompt_id"].nunique() == 5
    assert frames["kinds"].query("run == 'r48' and statistic == 'orbit'")["value"].iloc[0] == (
        pytest.approx(float((shared["kind"] == "orbit").mean()), abs=1e-12)
    )
    later = pd.concat([frames[t] for t in ("kinds", "steps", "lens")]).query("reference != ''")
    later = later[np.isfinite(later["low"])]
    assert len(later) >= 10
    assert (later["low"] <= later["difference"] + 1e-12).all()
    assert (later["difference"] <= later["high"] + 1e-12).all()
    assert frames["lambda_1"].empty
    again = corpus.compare([a, b], n_boot=300)  # the same seed: the same intervals
    pd.testing.assert_frame_equal(frames["kinds"], again["kinds"], check_exact=True)


def test_lambda_1_is_compared_where_every_run_has_it(runs, tmp_path):
    def with_lambda(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(lambda_1=-0.01 * frame["position"] - 0.001 * frame["token_id"] % 7)

    a, b = (_edited_copy(r, tmp_path / r.name, with_lambda) for r in runs)
    frames = corpus.compare([a, b], n_boot=100)
    table = frames["lambda_1"]
    assert set(table["statistic"]) == {"q25", "median", "q75"}
    first = corpus.load(a).query("seed == 0")["lambda_1"]
    value = table.query("run == 'r16' and statistic == 'median'")["value"].iloc[0]
    assert value == pytest.approx(first.median(), abs=1e-12)
    assert "λ_1 (the first seed's rows" in format_comparison(frames)


@pytest.mark.parametrize("how", ["token ids", "vocabulary"])
def test_other_tokenizers_are_compared_per_prompt_text(runs, tmp_path, how, capsys):
    a, b = runs
    if how == "token ids":
        other = _edited_copy(b, tmp_path / "r48", lambda f: f.assign(token_id=f["token_id"] + 1))
    else:
        other = _edited_copy(b, tmp_path / "r48", lambda f: f)
        manifest = (other / "manifest.json").read_text()
        (other / "manifest.json").write_text(
            manifest.replace('"vocab_size": 4096', '"vocab_size": 5000')
        )
    assert main(["compare", str(a), str(other), "--bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("Tokenizers differ"))
    assert "compared per prompt text" in line
    assert (
        "token ids differ for 5 of 5 shared prompts" if how == "token ids" else "4096 ≠ 5000"
    ) in line
    frames = corpus.compare([a, other], n_boot=100)
    assert frames["pairs"]["unit"].iloc[0] == "prompt"
    # per prompt: the share of a kind is the mean of the prompts' shares
    rows = corpus.load(a)
    per_prompt = rows.assign(orbit=rows["kind"] == "orbit").groupby("prompt_id")["orbit"].mean()
    value = frames["kinds"].query("run == 'r16' and statistic == 'orbit'")["value"].iloc[0]
    assert value == pytest.approx(per_prompt.mean(), abs=1e-12)


def test_a_directory_that_is_not_a_run_is_refused_in_one_line(runs, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(corpus.CorpusError, match="holds no corpus run"):
        corpus.compare([runs[0], tmp_path / "empty"])
    with pytest.raises(corpus.CorpusError, match="is not a corpus run"):
        corpus.compare([runs[0], tmp_path / "missing"])
    with pytest.raises(corpus.CorpusError, match="at least two"):
        corpus.compare([runs[0]])
    assert main(["compare", str(runs[0]), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_weighted_quantile_is_the_quantile_of_the_drawn_rows():
    rng = np.random.default_rng(1)
    values = rng.normal(size=40).round(1)  # ties included
    prompt = rng.integers(0, 6, size=40)
    weights = rng.integers(0, 4, size=(25, 6))
    weights[0] = 0  # a draw with no rows
    for q in (0.25, 0.5, 0.75):
        got = _weighted_quantile(values, prompt, weights, q)
        assert np.isnan(got[0])
        for row in range(1, 25):
            drawn = np.repeat(values, weights[row][prompt])
            assert got[row] == pytest.approx(np.quantile(drawn, q), abs=1e-12)


def test_every_figure_draws_and_an_empty_table_says_why(runs):
    frames = corpus.compare(list(runs), n_boot=50)
    drawn = figures.comparison_figures(frames)
    assert set(drawn) == {"kinds", "steps", "lambda_1", "lens"}
    assert all(isinstance(f, go.Figure) for f in drawn.values())
    kinds = drawn["kinds"]
    assert [t.name for t in kinds.data] == ["r16", "r48", "r48 − r16"]
    assert kinds.data[2].error_y.array is not None  # the interval on the difference
    assert len(drawn["steps"].data) == 3 and len(drawn["lens"].data) == 3
    assert (
        not drawn["lambda_1"].data
        and "not in every run" in drawn["lambda_1"].layout.annotations[0].text
    )
    empty = figures.kind_shares_figure(frames, group="no such source")
    assert not empty.data and empty.layout.annotations[0].text.startswith("no kind shares")
