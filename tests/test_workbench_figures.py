"""Figure builders: the traces carry the analysed values, and ticks, legends, colour bars and number
formats say what the data are."""

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import recurrent_model as rm
import workbench as wb
from workbench import figures
from workbench._frames import position_labels, printable, token_display_strings
from workbench.dynamics import KINDS
from workbench.figures._style import log_axis, short_number


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


def test_printable_labels_escape_what_a_reader_cannot_see():
    assert printable("a\nb\tc\x0c\u200b\ufffd") == "a\\nb\\tc\\x0c\\u200b\\ufffd"
    assert position_labels(["\n", " ", "ok"], 3) == ["0: '\\n'", "1: ' '", "2: 'ok'"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|end|>"])
    ids = backend.encode("é\n<|end|>").ids
    assert token_display_strings(backend, ids) == ["<0xC3>", "<0xA9>", "\\n", "<|end|>"]
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
        token_display_strings(backend, [10**6])


def test_number_formats_and_log_ticks():
    assert [short_number(v) for v in (0.000326, 2400, 0.9623, 3.9e-06, 0.0)] == [
        "3.26e-4", "2400", "0.962", "3.9e-6", "0",
    ]  # fmt: skip
    axis = log_axis([0.004, 0.03, 0.2], "spread")
    assert axis["type"] == "log" and axis["tickvals"][0] == pytest.approx(0.005)
    assert set(axis["ticktext"]) <= {"0.005", "0.01", "0.02", "0.05", "0.1", "0.2"}
    wide = log_axis([1e-7, 1.0], "spread")
    assert wide["tickvals"] == pytest.approx([10.0**e for e in range(-7, 1)])


def test_convergence_heatmap_has_token_labels_and_log_colour(traj):
    frame = wb.convergence(traj.states[0], tokens=traj.tokens)
    fig = figures.convergence_heatmap(frame)
    (heat,) = fig.data
    assert isinstance(fig, go.Figure) and heat.type == "heatmap"
    assert list(heat.y) == [f"{i}: '{t}'" for i, t in enumerate(traj.tokens)]
    assert heat.z.shape == (8, 7) and np.isfinite(heat.z).all()
    positive = heat.customdata[heat.customdata > 0]
    np.testing.assert_allclose(heat.z[heat.customdata > 0], np.log10(positive))
    linear = figures.convergence_heatmap(frame, value="relative_step", log=False)
    np.testing.assert_array_equal(linear.data[0].z, linear.data[0].customdata)


def test_pc_pairs_waterfall_rotation(traj):
    coords, pca = wb.project(traj.states[0], n_components=6)
    fig = figures.pc_pair_panels(
        coords, [0, 3], traj.tokens, explained_variance=pca.explained_variance_ratio_, run="seed 0"
    )
    assert len(fig.data) == 2 * 3 and "(seed 0)" in fig.layout.title.text
    for trace in fig.data:  # centred on the token's mean, coloured by step
        assert abs(np.mean(trace.x)) < 1e-4 and list(trace.marker.color) == list(range(7))
    np.testing.assert_allclose(fig.data[0].y, coords[:, 0, 1] - coords[:, 0, 1].mean(), atol=1e-5)
    water = figures.waterfall_3d(coords, traj.tokens, run="seed 1")
    lines, ends = water.data[:-1], water.data[-1]
    assert (
        len(lines) == 8
        and {t.mode for t in lines} == {"lines"}
        and "(seed 1)" in water.layout.title.text
    )
    np.testing.assert_allclose(lines[2].y, coords[:, 2, 0])
    np.testing.assert_allclose(ends.z, coords[-1, :, 1])
    assert water.layout.scene.camera.eye.x is not None  # a camera preset, not plotly's default view
    assert [t.line.showscale for t in lines].count(True) == 1
    few = figures.waterfall_3d(coords, traj.tokens, max_tokens=3)
    assert [t.x[0] for t in few.data[:-1]] == [0, 4, 7] and "3 of 8 tokens" in few.layout.title.text
    plane = np.eye(64)[:2]
    rot = figures.rotation_panel(traj.states[0][:, 1], plane, "tok", run="seed 0")
    assert [t.type for t in rot.data] == ["scatter", "scatter"] and len(rot.data[1].y) == 7
    bar_x = rot.data[0].marker.colorbar.x  # the step colour bar stands beside the path panel
    assert rot.layout.xaxis.domain[1] < bar_x < rot.layout.xaxis2.domain[0]
    assert rot.data[1].marker.showscale is not True


def test_seed_overlay_and_spread_curves(traj):
    coords, _ = wb.project(traj.states, n_components=2)
    fig = figures.seed_overlay(coords, 2, seeds=traj.seeds, tokens=traj.tokens)
    assert [t.name for t in fig.data if t.showlegend is not False] == ["seed 0", "seed 1", "seed 2"]
    np.testing.assert_allclose(fig.data[2].x, coords[1, :, 2, 0])
    spread = wb.path_independence(traj.states, tokens=traj.tokens)
    curves = figures.spread_curves(spread, positions=[0, 1], top_k=1)
    mean, *tokens = curves.data
    assert mean.name == "mean over tokens" and mean.showlegend is not False and mean.legendrank == 1
    chosen = spread[spread.position.isin([0, 1])]
    np.testing.assert_allclose(mean.y, chosen.groupby("step").spread.mean().to_numpy())
    last = chosen[chosen.step == chosen.step.max()].set_index("position").spread
    in_legend = [t.name for t in tokens if t.showlegend]
    assert in_legend == [position_labels(traj.tokens, 8)[int(last.idxmax())]]
    assert "attractor distance" in curves.layout.annotations[0].text


def test_lens_figures(lens_frame):
    heat = figures.lens_heatmap(lens_frame, "kl_to_final")
    assert heat.data[0].type == "heatmap" and heat.data[0].text.shape == (8, 7)
    kl = heat.data[0].customdata  # KL spans decades: log colour, exact zeros at the smallest KL
    floor = kl[kl > 0].min()
    np.testing.assert_allclose(heat.data[0].z, np.log10(np.where(kl > 0, kl, floor)))
    assert heat.data[0].colorbar.ticktext[0].startswith("1e")
    prob = figures.lens_heatmap(lens_frame, "final_prob").data[0]
    np.testing.assert_array_equal(prob.z, prob.customdata)
    table = figures.lens_table(lens_frame, 3)
    header, cells = table.data[0].header.values, table.data[0].cells.values
    assert header[-1] == "entropy" and len(table.data[0].columnwidth) == len(header)
    rows = lens_frame[lens_frame.position == 3].sort_values("step")
    assert list(cells[-1]) == [short_number(v) for v in rows.entropy]
    kl = list(cells[header.index("KL to final")])
    assert kl[-1] == "0" and all(k != "0" for k, v in zip(kl, rows.kl_to_final) if v > 0)
    assert all(len(c.replace("-", "").split("e")[0].replace(".", "").lstrip("0")) <= 3 for c in kl)


def test_curves_and_bars(traj):
    bars = figures.steps_per_token_bars([3, 5, 8], ["a", "b", "c"], max_steps=8)
    assert list(bars.data[0].y) == [3, 5, 8] and list(bars.data[0].x) == [
        "0: 'a'",
        "1: 'b'",
        "2: 'c'",
    ]
    frame = wb.step_dynamics(traj.states[0], traj.tokens)
    dyn = figures.step_curves(frame, "acceleration", top_k=3)
    assert len(dyn.data) == 8 and sum(bool(t.showlegend) for t in dyn.data) == 3
    for trace, (_, group) in zip(dyn.data, frame.groupby("position")):
        np.testing.assert_allclose(trace.y, group.sort_values("step").acceleration)
    corr_frame = wb.token_correlation(traj.states[0])
    corr = figures.token_correlation_curve(corr_frame)
    np.testing.assert_allclose(corr.data[0].y, corr_frame.correlation)


def _series_frame() -> pd.DataFrame:
    rows = []
    for step in (300, 1200, 2400, 3600):
        for depth in (1, 4, 16):
            row = dict(step=step, depth=depth, loss=7 - step / 1000 - depth / 10,
                       spread=10 ** (-step / 1500), token_correlation=0.2, train_loss=1.5)  # fmt: skip
            row.update({f"share_{k}": 1 / len(KINDS) for k in KINDS})
            rows.append(row)
    return pd.DataFrame(rows)


def test_training_ticks_on_checkpoints_and_sequential_legend():
    frame = _series_frame()
    fig = figures.checkpoint_series_figure(frame)
    for name in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
        assert list(fig.layout[name].tickvals) == [300, 1200, 2400, 3600]
    bars = [t for t in fig.data if t.type == "bar"]
    assert {tuple(b.x) for b in bars} == {(300, 1200, 2400, 3600)}
    depth_lines = [t for t in fig.data if t.name and t.name.startswith("r = ")]
    assert [t.name for t in depth_lines] == ["r = 1", "r = 4", "r = 16"]
    assert len({t.line.color for t in depth_lines}) == 3
    train = next(t for t in fig.data if t.name == "training loss (logged)")
    assert train.yaxis != depth_lines[0].yaxis  # its own axis: 1.5 beside 7 nats
    assert figures.LOSS_NOTE in [a.text.replace("<br>", " ") for a in fig.layout.annotations]
    spread_axis = fig.layout.yaxis4 if fig.layout.yaxis4.type == "log" else fig.layout.yaxis5
    assert spread_axis.type == "log" and len(spread_axis.tickvals) >= 2
    by_depth = figures.loss_by_depth_figure(frame)
    assert [t.name for t in by_depth.data] == ["step 300", "step 1200", "step 2400", "step 3600"]
    assert len({t.line.color for t in by_depth.data}) == 4
    assert list(by_depth.layout.xaxis.tickvals) == [1, 4, 16]


def _patch_frame(gap: float) -> pd.DataFrame:
    frame = pd.DataFrame(
        dict(position=[0, 0, 1, 1], step=[0, 1, 0, 1], token=["a", "a", "\n", "\n"],
             restored=[0.0, 0.5, 1.0, 0.2], clean=1.0 + gap, corrupted=1.0,
             gap_too_small=abs(gap) < 0.1)
    )  # fmt: skip
    frame.attrs.update(metric="logit_diff", min_gap=0.1)
    return frame


def test_patching_shows_the_gap_and_refuses_a_noise_grid():
    fig = figures.patching_heatmap(_patch_frame(2.5))
    assert fig.data[0].type == "heatmap" and list(fig.data[0].y) == ["0: 'a'", "1: '\\n'"]
    assert "clean 3.5, corrupted 1, gap 2.5" in fig.layout.title.text
    small = figures.patching_heatmap(_patch_frame(1e-4))
    assert not small.data and "gap 0.0001 (below 0.1)" in small.layout.annotations[0].text


def test_steering_ticks_are_short_and_the_legend_sits_above():
    sweep = pd.DataFrame(dict(alpha=[0.0, 0.5, 1.0], kl=[0.0, 0.000326, 0.00091],
                              logprob_change=[0.0, -0.2, -0.5], top_token=["a", "a", "b"]))  # fmt: skip
    fig = figures.steering_sweep_figure(sweep)
    assert fig.layout.yaxis.tickformat == ".2~e" and fig.layout.yaxis2.tickformat == ".3~g"
    assert fig.layout.legend.y >= 1 and fig.layout.legend.yanchor == "bottom"
    np.testing.assert_allclose(fig.data[0].y, sweep.kl)


def test_wavefront_frontier_is_visible_in_plot_and_legend():
    frame = pd.DataFrame(dict(step=[0, 0, 1, 1], position=[0, 1, 0, 1], recurrence=[4, 4, 8, 4],
                              token=[5, 6, 5, 7], frozen=[False, False, True, False]))  # fmt: skip
    frontier = pd.DataFrame(dict(step=[0, 1], frozen_length=[0, 1], wave_end=[2, 2]))
    fig = figures.wavefront_heatmap(frame, frontier, {5: "\n", 6: "b", 7: "c"})
    line = next(t for t in fig.data if t.name == "frozen frontier")
    assert line.line.color.lower() not in ("white", "#fff", "#ffffff")
    assert "'\\n' (frozen)" in fig.data[0].customdata[1][0]
    assert fig.layout.height >= 420
