"""The notebooks run top to bottom (kernel python3) from the repository root and from notebooks/,
their figures carry data, the claims their prose makes hold on what they computed, and they are
stored with their outputs stripped."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = [
    "orbits_and_rotations.ipynb",
    "path_independence.ipynb",
    "convergence.ipynb",
    "interventions.ipynb",
    "training_dynamics.ipynb",
    "stability.ipynb",
    "corpus.ipynb",
]
# Where each notebook's kernel starts: JupyterLab starts it in notebooks/ (`make notebooks`), a
# kernel started elsewhere in the repository root. The slower notebooks run from one place only.
WORKING_DIRECTORIES = {
    "orbits_and_rotations.ipynb": ("notebooks", "root"),
    "path_independence.ipynb": ("root",),
    "convergence.ipynb": ("notebooks",),
    "interventions.ipynb": ("root",),
    "training_dynamics.ipynb": ("notebooks", "root"),
    "corpus.ipynb": ("notebooks",),
}
# What each notebook's prose says, checked on its own variables after its last cell.
CLAIMS = {
    "orbits_and_rotations.ipynb": """
assert len(orbits) > 0, "the prose discusses orbiting tokens, but none orbit"
assert (kinds.to_numpy() == "orbit").all(), "the prose says every seed reaches the same orbit"
shared = attractor.loc[shown]
assert (shared.attractor_distance < shared.final_spread).all(), "a shared orbit, phase apart"
""",
    "path_independence.ipynb": """
assert summary["mean"].iloc[-1] < 1e-2 * summary["mean"].iloc[0], "the seeds do not converge"
assert (table["kind"] == "fixed_point").all(), "the prose says every token is a fixed point"
""",
    "convergence.ipynb": """
first, last = (conv[conv.step == s].distance_to_final.mean() for s in (0, STEPS))
assert last < 1e-2 * first, "the prose says the states converge"
assert corr["correlation"].max() < 0.3, "the prose says the token correlation stays below 0.3"
assert per_step["kl_to_final"].loc[8] < 1e-2, "the prose says KL < 0.01 within about 8 steps"
""",
    "interventions.ipynb": """
gap = float(patched["clean"].iloc[0] - patched["corrupted"].iloc[0])
assert abs(gap) >= 1.0, f"the default pair's clean/corrupted gap is only {gap:.3g}"
assert not patched["gap_too_small"].any()
early = by_position.loc[:, by_position.columns <= STEPS // 2]
assert early.abs().to_numpy().max() < 0.05, "the prose says early patches restore nothing"
assert by_position[STEPS].max() > 0.3, "the prose says the last steps restore part of the gap"
assert (sweep["top_token"] == sweep["top_token"].iloc[0]).all() and sweep["kl"].max() < 0.05
assert result.percentile >= 95 and result.effect > 10 * result.control_mean
""",
    "training_dynamics.ipynb": """
steps = sorted(series["step"].unique())
fig = figures.checkpoint_series_figure(series)
assert list(fig.layout.xaxis.tickvals) == steps
gain = summary["gain r=1→r̄"]
assert gain.iloc[0] <= 0 < gain.iloc[-1], "the prose says depth pays only late in training"
assert kinds["share_orbit"].iloc[-1] == 0, "the prose says no token orbits at the end"
assert (kinds["share_fixed_point"].iloc[-2:] == 1).all(), "the prose says every token settles from 2400"
""",
    "corpus.ipynb": """
assert len(frame) == 384 and len(prompts) == 8 and (prompts["tokens"] == 24).all()
assert (frame.groupby(["prompt_id", "position"])["seed_spread"].nunique() == 1).all()
assert tables["meta"]["num_steps"] == 128 and tables["meta"]["kind_agrees_across_seeds"] == 1.0
for shares in (tables["by_source"], tables["by_category"]):
    assert (shares["fixed_point"] == 1).all() and (shares["converging"] == 0).all(), "all settled"
assert tables["periods"].sum() == 0, "the prose says no token orbits"
steps = tables["steps_by_source"]
assert (steps["never"] == 0).all() and (tables["steps_by_difficulty"]["never"] == 0).all()
assert steps.loc["arithmetic", "median"] == 10 and steps.loc["code", "median"] == 13
levels = tables["steps_by_difficulty"]["median"]
assert levels["arithmetic:1"] == 6 and levels.drop("arithmetic:1").between(10, 13).all()
assert (tables["steps_by_difficulty"]["tokens"] == 48).all(), "one prompt per level"
""",
}


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "strip the outputs"


def _runs():
    return [(name, where) for name in NAMES for where in WORKING_DIRECTORIES.get(name, ("root",))]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "where"), _runs())
def test_notebook_runs_and_its_prose_holds(name, where):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    if name in CLAIMS:
        nb.cells.append(nbformat.v4.new_code_cell(CLAIMS[name]))
    cwd = NOTEBOOKS if where == "notebooks" else ROOT
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell or claim
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [
        o["data"]["application/vnd.plotly.v1+json"]
        for o in outputs
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    assert len(figures) >= 3
    for figure in figures:  # every figure draws something: a trace with values, or a note
        traces = figure["data"]
        values = [
            v for t in traces for key in ("x", "y", "z", "cells") if key in t for v in [t[key]]
        ]
        assert values or figure["layout"].get("annotations"), "an empty figure"
