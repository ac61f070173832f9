"""workbench.checkpoint_series: a run's checkpoints analysed in step order, and its figure."""

import json

import numpy as np
import pytest
import torch

import workbench as wb
from recurrent_model.standin import fallback_model
from recurrent_model.threads import single_thread
from workbench.checkpoint_series import checkpoint_dirs
from workbench.figures import checkpoint_series_figure

TEXT = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    for step, seed in ((20, 2), (5, 1)):  # written out of order on purpose
        fallback_model(seed=seed).save_pretrained(run / "checkpoints" / f"step-{step:07d}")
    (run / "checkpoints" / "step-0000030").mkdir()  # incomplete: no config.json
    lines = [{"step": 5, "loss": 6.5}, {"step": 10, "loss": 6.0}, {"step": 20, "loss": 5.25}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


@pytest.fixture(scope="module")
def series(run_dir):
    with single_thread(True):
        return wb.checkpoint_series(run_dir, [TEXT], depths=(1, 3), num_steps=16, seeds=(0, 1))


def test_rows_in_step_order_with_logged_losses(series):
    assert series["step"].tolist() == [5, 5, 20, 20]
    assert series["depth"].tolist() == [1, 3, 1, 3]
    assert series["train_loss"].tolist() == [6.5, 6.5, 5.25, 5.25]
    shares = series[
        [f"share_{k}" for k in ("fixed_point", "converging", "orbit", "slider", "other")]
    ]
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)
    assert (series.loc[series["depth"] == 1, "gain"] == 0).all()


def test_losses_match_the_model_run_directly(series):
    for step, seed in ((5, 1), (20, 2)):
        model = fallback_model(seed=seed)
        ids = torch.tensor([model.tokenizer.encode(TEXT)])
        for depth in (1, 3):
            g = torch.Generator().manual_seed(0)
            with torch.no_grad():
                loss = model(ids[:, :-1], num_steps=depth, labels=ids[:, 1:], generator=g).loss
            row = series[(series["step"] == step) & (series["depth"] == depth)]
            assert row["loss"].item() == pytest.approx(float(loss), rel=1e-5)
    # different weights, different numbers: the rows really come from their own checkpoints
    assert series.loc[0, "loss"] != series.loc[2, "loss"]


def test_spread_and_correlation_are_per_checkpoint_numbers(series):
    per_step = series.drop_duplicates("step")
    assert (per_step["spread"] > 0).all() and per_step["spread"].nunique() == 2
    assert per_step["token_correlation"].between(-1, 1).all()


def test_checkpoint_discovery_and_errors(run_dir, tmp_path):
    assert [s for s, _ in checkpoint_dirs(run_dir)] == [5, 20]
    assert [s for s, _ in checkpoint_dirs(run_dir / "checkpoints")] == [5, 20]
    with pytest.raises(FileNotFoundError, match="no step-N checkpoint"):
        checkpoint_dirs(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpoint_dirs(tmp_path / "missing")
    with pytest.raises(ValueError, match="texts is empty"):
        wb.checkpoint_series(run_dir, [])
    with pytest.raises(ValueError, match=r"no checkpoint for step\(s\) \[7\]"):
        wb.checkpoint_series(run_dir, [TEXT], steps=[7])


def test_figure_has_a_trace_per_depth_and_kind(series):
    fig = checkpoint_series_figure(series)
    names = [t.name for t in fig.data]
    assert names[:2] == ["r = 1", "r = 3"] and "training loss (logged)" in names
    steps = sorted(series["step"].unique())
    assert list(fig.layout.xaxis.tickvals) == steps and list(fig.layout.xaxis3.tickvals) == steps
    assert {"fixed_point", "orbit", "slider", "other"} <= set(names)
    with pytest.raises(ValueError, match="missing column"):
        checkpoint_series_figure(series.drop(columns=["spread"]))


def test_the_training_view_counts_the_labels_the_dynamics_tab_shows(
    shipped_model, tmp_path, one_thread
):
    # One label per token: a fixed point that has not settled is "converging" in every view.
    from apps.tab_dynamics import shown_kinds
    from workbench.dynamics import LABELS, label_shares

    shipped_model.save_pretrained(tmp_path / "checkpoints" / "step-0000001")
    prompt = "Claire makes a 3 egg omelet every morning for breakfast."
    series = wb.checkpoint_series(tmp_path, [prompt], depths=(1,), num_steps=16, seeds=(0, 1))
    ids = shipped_model.tokenizer.encode(prompt)
    traj = wb.collect(shipped_model, ids, 16, seeds=(0, 1), progress=False)
    verdicts = wb.classify_dynamics(traj.states[0])  # both views classify the first seed
    app = shown_kinds(verdicts).value_counts(normalize=True)
    library = label_shares(verdicts)
    for label in LABELS:
        assert series[f"share_{label}"].iloc[0] == pytest.approx(library[label])
        assert library[label] == pytest.approx(float(app.get(label, 0.0)))
    assert library["converging"] > 0  # at 16 steps most tokens are still on their way
