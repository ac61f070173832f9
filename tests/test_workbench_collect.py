"""Collecting trajectories from a model, and the Trajectory container (views, frame, save/load)."""

import numpy as np
import pytest
import torch

import workbench as wb
from recurrent_model.hook_names import STATE

IDS = torch.arange(3, 15)


def test_collect_shapes_seeds_and_matches_run_with_cache(model):
    traj = wb.collect(model, IDS, 5, seeds=(0, 1, 2), progress=False, batch_size=2)
    assert traj.states.shape == (3, 6, 12, 64)
    assert traj.seeds == (0, 1, 2) and traj.init_scales == (1.0, 1.0, 1.0)
    assert traj.tokens == [str(i) for i in range(3, 15)] and traj.model_name == "tiny"
    _, cache = model.run_with_cache(
        IDS[None],
        num_steps=5,
        names_filter=STATE,
        generator=torch.Generator().manual_seed(1),
    )
    raw = cache[STATE][:, 0]
    # the aligned layout (right-padded to 16 positions) is the unpadded forward up to rounding,
    # and exactly the forward on the padded ids with the same s_0
    np.testing.assert_allclose(traj.raw_states[1], raw.numpy(), rtol=1e-5, atol=1e-5)
    padded = torch.cat([IDS, torch.zeros(16 - len(IDS), dtype=torch.long)])[None]
    init = torch.zeros(1, 16, 64)
    init[:, : len(IDS)] = cache[STATE][0]
    _, aligned = model.run_with_cache(padded, num_steps=5, init_state=init, names_filter=STATE)
    exact = aligned[STATE][:, 0, : len(IDS)]
    np.testing.assert_array_equal(traj.raw_states[1], exact.numpy())
    np.testing.assert_array_equal(traj.states[1], model.transformer.ln_f(exact).detach().numpy())
    assert not np.allclose(traj.states[0], traj.states[1])


def test_collect_is_independent_of_batching(model):
    a = wb.collect(model, IDS, 3, seeds=(4, 5, 6), progress=False, batch_size=1)
    b = wb.collect(model, IDS[None], 3, seeds=(4, 5, 6), progress=False, batch_size=3)
    np.testing.assert_array_equal(a.raw_states, b.raw_states)


def test_init_scale_zero_is_deterministic_and_runs_once(model):
    traj = wb.collect(model, IDS, 4, seeds=(0, 1), init_scale=(1.0, 0.0), progress=False)
    assert traj.init_scales == (1.0, 1.0, 0.0) and traj.seeds == (0, 1, 0)
    np.testing.assert_array_equal(traj.raw_states[2, 0], 0.0)
    other = wb.collect(model, IDS, 4, seeds=(9,), init_scale=0.0, progress=False)
    np.testing.assert_array_equal(other.raw_states[0], traj.raw_states[2])
    assert traj.select(init_scale=0.0).n_runs == 1
    assert traj.select(runs=[0, 1]).seeds == (0, 1)


def test_raw_view_and_float16_storage(model):
    traj = wb.collect(model, IDS, 3, normalized=False, dtype=np.float16, progress=False)
    assert traj.states.dtype == np.float16 and traj.states is traj.raw_states
    assert traj.normalized_states.shape == traj.raw_states.shape
    rms = np.sqrt((traj.normalized_states.astype(np.float32) ** 2).mean(-1))
    np.testing.assert_allclose(rms, 1.0, atol=1e-2)  # ln_f weight is 1 at init


def test_memory_limit_error_names_the_size(model):
    with pytest.raises(wb.TrajectoryTooLarge, match=r"needs about .* GiB .*bytes"):
        wb.collect(model, IDS, 100, seeds=range(10), max_bytes=10_000, progress=False)
    with pytest.raises(MemoryError):
        wb.collect_sublayers(model, IDS, 100, max_bytes=10_000)


def test_bad_inputs_are_refused(model):
    with pytest.raises(ValueError, match="one non-empty sequence"):
        wb.collect(model, torch.zeros(2, 4, dtype=torch.long), 2, progress=False)
    with pytest.raises(ValueError, match="num_steps"):
        wb.collect(model, IDS, 0, progress=False)


def test_save_load_round_trip_is_exact(model, tmp_path):
    for dtype in (np.float32, np.float16):
        traj = wb.collect(
            model, IDS, 3, seeds=(0, 7), init_scale=(0.5, 0.0), dtype=dtype, progress=False
        )
        traj.tokens[0] = "héllo\n"
        path = tmp_path / f"traj-{np.dtype(dtype).name}.safetensors"
        traj.save(path)
        back = wb.Trajectory.load(path)
        assert back.raw_states.dtype == traj.raw_states.dtype
        np.testing.assert_array_equal(back.raw_states, traj.raw_states)
        np.testing.assert_array_equal(back.states, traj.states)
        np.testing.assert_array_equal(back.token_ids, traj.token_ids)
        np.testing.assert_array_equal(back.norm_weight, traj.norm_weight)
        assert (back.tokens, back.seeds, back.init_scales, back.model_name, back.norm_eps) == (
            traj.tokens,
            traj.seeds,
            traj.init_scales,
            traj.model_name,
            traj.norm_eps,
        )


def test_load_refuses_other_files(tmp_path):
    from safetensors.numpy import save_file

    save_file({"x": np.zeros(3, dtype=np.float32)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a workbench trajectory"):
        wb.Trajectory.load(tmp_path / "other.safetensors")


def test_long_frame(model):
    traj = wb.collect(model, IDS, 2, seeds=(0, 1), progress=False)
    frame = traj.to_frame()
    assert len(frame) == 2 * 3 * 12
    row = frame[(frame.run == 1) & (frame.step == 2) & (frame.position == 5)].iloc[0]
    assert row.seed == 1 and row.token == "8"
    np.testing.assert_allclose(row.norm, np.linalg.norm(traj.states[1, 2, 5]), rtol=1e-6)
    wide = traj.to_frame(include_states=True)
    np.testing.assert_array_equal(
        wide.loc[row.name, ["x0", "x63"]].to_numpy(dtype=np.float32), traj.states[1, 2, 5, [0, 63]]
    )


def test_collect_sublayers_last_layer_is_the_state(model):
    sub = wb.collect_sublayers(model, IDS, 4, seed=3)
    traj = wb.collect(model, IDS, 4, seeds=(3,), progress=False)
    assert sub.shape == (4, 2, 12, 64)
    np.testing.assert_array_equal(sub[:, -1], traj.raw_states[0, 1:])


def test_progress_callback_counts_every_run_and_iteration(model):
    calls = []
    traj = wb.collect(
        model,
        IDS,
        4,
        seeds=(0, 1, 2),
        progress=False,
        batch_size=2,
        on_progress=lambda d, t: calls.append((d, t)),
    )
    # 3 runs × 4 iterations; batches of 2 then 1 run: 2 per iteration, then 1
    assert calls == [
        (0, 12),
        (2, 12),
        (4, 12),
        (6, 12),
        (8, 12),
        (9, 12),
        (10, 12),
        (11, 12),
        (12, 12),
    ]
    plain = wb.collect(model, IDS, 4, seeds=(0, 1, 2), progress=False, batch_size=2)
    np.testing.assert_array_equal(traj.raw_states, plain.raw_states)  # the hook changes nothing
