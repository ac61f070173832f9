"""Corpus figure builders on hand-made summary tables: the traces carry the summary's values,
converging is its own segment beside settled fixed points, and empty or missing data say so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench import figures
from workbench.figures.corpus import kind_segments


def _shares() -> pd.DataFrame:
    """A shares table as ``workbench.corpus.summary`` gives it (fixed_point counts converging)."""
    return pd.DataFrame(
        {"fixed_point": [0.7, 0.5], "orbit": [0.2, 0.1], "slider": [0.0, 0.3],
         "other": [0.1, 0.1], "converging": [0.3, 0.0], "tokens": [40, 1200],
         "median_final_step": [1e-4, 1e-6]},
        index=pd.Index(["code", "prose"], name="source"),
    )  # fmt: skip


def _steps() -> pd.DataFrame:
    return pd.DataFrame(
        {"median": [10.0, 18.0], "q25": [7.0, 14.0], "q75": [13.0, 23.0], "never": [0.0, 0.25],
         "tokens": [256, 254]},
        index=pd.Index(["arithmetic", "prose"], name="source"),
    )  # fmt: skip


def test_kind_shares_split_fixed_points_into_settled_and_converging():
    segments = kind_segments(_shares())
    np.testing.assert_allclose(segments.sum(axis=1), [1.0, 1.0])
    np.testing.assert_allclose(segments["settled"], [0.4, 0.5])
    fig = figures.kind_share_bars(_shares(), by="source")
    names = [t.name for t in fig.data]
    assert names == ["fixed point (settled)", "converging", "orbit", "slider", "other"]
    assert fig.data[0].marker.color != fig.data[1].marker.color
    assert fig.data[1].marker.pattern.shape == "/"
    np.testing.assert_allclose(fig.data[1].y, [0.3, 0.0])
    assert list(fig.data[0].x) == ["code<br>40 tokens", "prose<br>1,200 tokens"]
    assert fig.layout.barmode == "stack" and fig.layout.yaxis.tickformat == ".0%"
    assert fig.data[1].text == ("30%", "")  # no label on an empty segment
    with pytest.raises(ValueError, match="converging"):
        figures.kind_share_bars(_shares().drop(columns="converging"))


def test_period_histogram_labels_the_cap_and_says_when_there_are_no_orbits():
    fig = figures.period_histogram_figure(pd.Series({16: 1, 2: 5, 5: 3}), cap=16)
    assert list(fig.data[0].x) == ["2", "5", "≥16"] and list(fig.data[0].y) == [5, 3, 1]
    assert "9 orbiting" in fig.layout.title.text
    empty = figures.period_histogram_figure(pd.Series([], dtype=int))
    assert not empty.data and empty.layout.annotations[0].text == "no orbits in this run"


def test_steps_carry_medians_quartiles_and_the_never_share():
    difficulty = _steps().rename(index={"arithmetic": "arithmetic:1", "prose": "arithmetic:2"})
    fig = figures.convergence_steps_figure(_steps(), difficulty)
    assert len(fig.data) == 2 and fig.data[1].xaxis == "x2"
    bars = fig.data[0]
    np.testing.assert_allclose(bars.y, [10, 18])
    np.testing.assert_allclose(bars.error_y.array, [3, 5])
    np.testing.assert_allclose(bars.error_y.arrayminus, [3, 4])
    assert list(bars.x) == ["arithmetic", "prose<br>never 25%"]
    alone = figures.convergence_steps_figure(_steps(), pd.DataFrame())
    assert len(alone.data) == 1


def test_lambda_quantiles_as_boxes_with_the_neutral_share():
    table = pd.DataFrame(
        {"q05": [-0.3], "q25": [-0.2], "q50": [-0.1], "q75": [-0.05], "q95": [0.01],
         "neutral": [0.125], "positive": [0.05]},
        index=pd.Index(["code"], name="source"),
    )  # fmt: skip
    fig = figures.lambda_quantiles_figure(table)
    box = fig.data[0]
    assert box.type == "box" and list(box.median) == [-0.1] and list(box.upperfence) == [0.01]
    assert box.x[0] == "code<br>neutral 12% · positive 5%"
    with pytest.raises(ValueError, match="q05"):
        figures.lambda_quantiles_figure(table.drop(columns="q05"))
