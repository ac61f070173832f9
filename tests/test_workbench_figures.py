"""Figure builders return plotly figures with the expected traces."""

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import recurrent_model as rm
import workbench as wb
from workbench import figures


@pytest.fixture(scope="module")
def model_and_traj():
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    return model, wb.collect(model, torch.arange(1, 9), 6, seeds=(0, 1, 2), progress=False)


@pytest.fixture(scope="module")
def traj(model_and_traj):
    return model_and_traj[1]


@pytest.fixture(scope="module")
def lens_frame(model_and_traj):
    model, traj = model_and_traj
    return wb.lens(model, traj.raw_states[0], tokens=traj.tokens)


def test_convergence_heatmap_has_token_labels_and_log_colour(traj):
    frame = wb.convergence(traj.states[0], tokens=traj.tokens)
    fig = figures.convergence_heatmap(frame)
    (heat,) = fig.data
    assert isinstance(fig, go.Figure) and heat.type == "heatmap"
    assert list(heat.y) == [f"{i}: {t!r}" for i, t in enumerate(traj.tokens)]
    assert heat.z.shape == (8, 7) and np.isfinite(heat.z).all()
    positive = heat.customdata[heat.customdata > 0]
    np.testing.assert_allclose(heat.z[heat.customdata > 0], np.log10(positive))
    linear = figures.convergence_heatmap(frame, value="relative_step", log=False)
    np.testing.assert_array_equal(linear.data[0].z, linear.data[0].customdata)


def test_pc_pairs_waterfall_rotation(traj):
    coords, pca = wb.project(traj.states[0], n_components=6)
    fig = figures.pc_pair_panels(
        coords, [0, 3], traj.tokens, explained_variance=pca.explained_variance_ratio_
    )
    assert len(fig.data) == 2 * 3
    for trace in fig.data:  # centred on the token's mean, coloured by step
        assert abs(np.mean(trace.x)) < 1e-4 and list(trace.marker.color) == list(range(7))
    assert len(figures.waterfall_3d(coords, traj.tokens).data) == 8
    assert {t.type for t in figures.waterfall_3d(coords).data} == {"scatter3d"}
    plane = np.eye(64)[:2]
    rot = figures.rotation_panel(traj.states[0][:, 1], plane, "tok")
    assert [t.type for t in rot.data] == ["scatter", "scatter"] and len(rot.data[1].y) == 7


def test_seed_overlay_and_spread_curves(traj):
    coords, _ = wb.project(traj.states, n_components=2)
    fig = figures.seed_overlay(coords, 2, seeds=traj.seeds, tokens=traj.tokens)
    assert [t.name for t in fig.data if t.showlegend is not False] == ["seed 0", "seed 1", "seed 2"]
    spread = wb.path_independence(traj.states, tokens=traj.tokens)
    curves = figures.spread_curves(spread, positions=[0, 1])
    assert len(curves.data) == 3 and curves.data[-1].name == "mean over tokens"


def test_lens_figures(lens_frame):
    heat = figures.lens_heatmap(lens_frame, "kl_to_final")
    assert heat.data[0].type == "heatmap" and heat.data[0].text.shape == (8, 7)
    table = figures.lens_table(lens_frame, 3)
    assert table.data[0].type == "table" and len(table.data[0].cells.values[0]) == 7


def test_curves_and_bars(traj):
    bars = figures.steps_per_token_bars([3, 5, 8], ["a", "b", "c"], max_steps=8)
    assert list(bars.data[0].y) == [3, 5, 8] and bars.data[0].type == "bar"
    dyn = figures.step_curves(wb.step_dynamics(traj.states[0], traj.tokens), "acceleration")
    assert len(dyn.data) == 8
    corr = figures.token_correlation_curve(wb.token_correlation(traj.states[0]))
    assert len(corr.data[0].y) == 7
