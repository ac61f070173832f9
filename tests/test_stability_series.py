"""λ_1 per checkpoint in checkpoint_series (opt-in) and the per-token exponents behind it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import recurrent_model as rm
import workbench
from workbench.core_map import CoreMap, initial_state
from workbench.lyapunov import lyapunov_run, token_exponents

ROOT = Path(__file__).resolve().parents[1]
SERIES = ROOT / "checkpoints" / "default" / "series"


def test_token_exponents_match_one_token_runs(one_thread):
    if not (ROOT / "checkpoints" / "default" / "model.safetensors").is_file():
        pytest.skip("checkpoints/default is not present")
    model = rm.load_model(ROOT / "checkpoints" / "default")
    ids = model.tokenizer.encode("Claire makes a 3 egg")
    core = CoreMap.from_model(model, ids)
    start = initial_state(model, core, 1.0, 0)
    every = token_exponents(core, start, 64, warmup=32)
    for position in (0, len(ids) - 1):
        one = lyapunov_run(model, ids, 64, position=position, k=1, warmup=32, init_scale=1.0)
        assert every[position] == pytest.approx(one.exponents[0], abs=0.01)  # other start vectors


def test_checkpoint_series_adds_lambda_1_only_when_asked(one_thread):
    if not SERIES.is_dir():
        pytest.skip("checkpoints/default/series is not present")
    kwargs = dict(depths=(1,), num_steps=16, seeds=(0, 1), steps=[300])
    plain = workbench.checkpoint_series(SERIES, ["def add(a, b):"], **kwargs)
    assert "lambda_1_mean" not in plain.columns
    frame = workbench.checkpoint_series(SERIES, ["def add(a, b):"], stability=True, **kwargs)
    assert {"lambda_1_mean", "lambda_1_max", "share_stable", "share_neutral",
            "lambda_1_max_stderr"} <= set(frame.columns)  # fmt: skip
    assert frame["lambda_1_max_stderr"].iloc[0] > 0 and 0 <= frame["share_neutral"].iloc[0] <= 1
    assert np.isfinite(frame["lambda_1_max"]).all() and 0 <= frame["share_stable"].iloc[0] <= 1
    assert frame["lambda_1_mean"].iloc[0] <= frame["lambda_1_max"].iloc[0]
