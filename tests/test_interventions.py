"""Patching, steering and ablation over depth on a tiny random model: known answers, batched = one at
a time, no-op interventions, exact projections and the random-subspace control."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import workbench as wb
from recurrent_model.hook_names import STATE, E, core
from recurrent_model.hooks import Hook, HookError
from recurrent_model.standin import DEFAULT_CHECKPOINT
from workbench.ablation import random_bases
from workbench.interventions_common import Cancelled
from workbench.patching import MIN_GAP, patching_pair

STEPS = 4
# Different batch sizes take different float32 GEMM paths (and, with 2 threads, different splits);
# "restored" is a ratio of log-prob differences that magnifies their rounding to ~2e-5.
RATIO_ATOL = 1e-4


@pytest.fixture(scope="module")
def pair(model) -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(
        0, model.config.vocab_size, (6,), generator=torch.Generator().manual_seed(1)
    )
    corrupted = clean.clone()
    corrupted[2] = (corrupted[2] + 7) % model.config.vocab_size
    return clean, corrupted


def _grid(df):
    return df.pivot(index="position", columns="step", values="restored")


# Patching ----------------------------------------------------------------------------------------
def test_patching_every_position_of_final_state_restores_one_and_s0_restores_zero(model, pair):
    df = wb.patch_states(model, *pair, STEPS, positions="all")
    assert list(df.position.unique()) == [-1] and list(df.step) == list(range(STEPS + 1))
    restored = df.set_index("step").restored
    assert restored[STEPS] == pytest.approx(1.0, abs=1e-5)
    assert restored[0] == 0.0  # s_0 = 0 in both runs: patching it changes nothing
    assert np.ptp(df.restored) > 0.1  # the intermediate steps are not trivially 0 or 1


def test_positions_before_the_corruption_restore_nothing_and_the_grid_has_one_row_per_cell(
    model, pair
):
    df = wb.patch_states(model, *pair, STEPS)
    assert len(df) == 6 * (STEPS + 1)
    grid = _grid(df)
    assert (grid.loc[[0, 1]] == 0).all().all()  # causal: the same activations in both runs
    assert (grid[0] == 0).all()
    assert grid.loc[2].abs().max() > 0.05  # the corrupted position itself matters


def test_restored_matches_a_hand_written_patch(model, pair):
    clean, corrupted = pair
    hook, pos, step = core(1, "hook_resid_post"), 2, 3
    df = wb.patch_states(model, clean, corrupted, STEPS, hook=hook, positions=[pos], steps=[step])
    with torch.no_grad():
        out_c, cache = model.run_with_cache(
            clean[None], num_steps=STEPS, names_filter=hook, init_scale=0.0
        )
        out_x = model(corrupted[None], num_steps=STEPS, init_scale=0.0)

        def put(x, h):
            if h.step == step:
                x = x.clone()
                x[0, pos] = cache[hook][step - 1][0, pos]
                return x
            return None

        with model.hooks([(hook, put)]):
            out_p = model(corrupted[None], num_steps=STEPS, init_scale=0.0)
    lp = [torch.log_softmax(o.logits[0, -1], -1) for o in (out_c, out_x, out_p)]
    target = int(lp[0].argmax())
    expected = float((lp[2][target] - lp[1][target]) / (lp[0][target] - lp[1][target]))
    assert df.restored[0] == pytest.approx(expected, abs=1e-5)
    assert df.logprob[0] == pytest.approx(float(lp[2][target]), abs=1e-5)


@pytest.mark.parametrize("hook", [STATE, core(0, "hook_attn_out"), E])
def test_batched_patches_equal_one_at_a_time(model, pair, hook):
    batched = wb.patch_states(model, *pair, STEPS, hook=hook, batch_size=64)
    single = wb.patch_states(model, *pair, STEPS, hook=hook, batch_size=1)
    np.testing.assert_allclose(batched.restored, single.restored, atol=RATIO_ATOL)
    if hook == E:
        assert (batched.step == -1).all() and len(batched) == 6


@pytest.mark.parametrize(
    ("direction", "hook"),
    [
        ("denoising", STATE),
        ("noising", STATE),
        ("noising", core(1, "hook_mlp_out")),
    ],
)
def test_resuming_from_the_cached_state_equals_patching_through_the_hook(
    model, pair, direction, hook
):
    kwargs = dict(direction=direction, init_scale=1.0, hook=hook)
    resumed = wb.patch_states(model, *pair, STEPS, reuse_prefix=True, batch_size=7, **kwargs)
    hooked = wb.patch_states(model, *pair, STEPS, reuse_prefix=False, batch_size=64, **kwargs)
    np.testing.assert_allclose(resumed.restored, hooked.restored, atol=RATIO_ATOL)
    assert resumed[["position", "step"]].equals(hooked[["position", "step"]])


def test_noising_is_the_reverse_direction(model, pair):
    df = wb.patch_states(model, *pair, STEPS, positions="all", direction="noising")
    restored = df.set_index("step").restored
    assert restored[0] == 1.0  # the clean run with the (identical) corrupted s_0
    assert restored[STEPS] == pytest.approx(0.0, abs=1e-5)  # the corrupted s_r everywhere


def test_random_init_is_shared_by_all_runs(model, pair):
    df = wb.patch_states(model, *pair, STEPS, positions="all", init_scale=1.0)
    restored = df.set_index("step").restored
    assert restored[0] == 0.0 and restored[STEPS] == pytest.approx(1.0, abs=1e-5)


def test_patching_rejects_bad_input(model, pair):
    clean, corrupted = pair
    with pytest.raises(ValueError, match="same length"):
        wb.patch_states(model, clean, corrupted[:5], STEPS)
    with pytest.raises(HookError, match="no hook named"):
        wb.patch_states(model, clean, corrupted, STEPS, hook="core.hook_nothing")
    with pytest.raises(ValueError, match="positions"):
        wb.patch_states(model, clean, corrupted, STEPS, positions=[6])
    with pytest.raises(ValueError, match="does not fire at step"):
        wb.patch_states(model, clean, corrupted, STEPS, hook=core(0, "hook_mlp_out"), steps=[0])
    with pytest.raises(ValueError, match="identical"):
        wb.patch_states(model, clean, clean, STEPS)
    with pytest.raises(ValueError, match="metric"):
        wb.patch_states(model, clean, corrupted, STEPS, metric="kl")
    with pytest.raises(ValueError, match="direction"):
        wb.patch_states(model, clean, corrupted, STEPS, direction="sideways")


def _last_logits(model, ids):
    return model(torch.as_tensor(ids)[None], num_steps=STEPS, init_scale=0.0).logits[0, -1]


def test_logit_diff_frame_carries_the_unpatched_runs_and_restores_one_at_the_end(model, pair):
    clean, corrupted = pair
    with torch.no_grad():
        lc, lk = _last_logits(model, clean), _last_logits(model, corrupted)
    target, other = int(lc.argmax()), int(lk.argmax())
    if target == other:  # the fixture's corruption must change the answer for this test
        other = int(lk.topk(2).indices[1])
    df = wb.patch_states(
        model, clean, corrupted, STEPS, metric="logit_diff", positions="all",
        corrupted_target=other,
    )  # fmt: skip
    assert df.clean.iloc[0] == pytest.approx(float(lc[target] - lc[other]), abs=1e-4)
    assert df.corrupted.iloc[0] == pytest.approx(float(lk[target] - lk[other]), abs=1e-4)
    assert df.attrs["metric"] == "logit_diff" and df.attrs["corrupted_target"] == other
    assert df.attrs["gap"] == pytest.approx(df.clean.iloc[0] - df.corrupted.iloc[0])
    restored = df.set_index("step").restored
    assert restored[STEPS] == pytest.approx(1.0, abs=1e-4) and restored[0] == 0.0
    # restored is (patched − corrupted) / (clean − corrupted) of the patched metric
    expect = (df.patched - df.corrupted) / (df.clean - df.corrupted)
    np.testing.assert_allclose(df.restored, expect, atol=1e-12)


def test_logit_diff_needs_two_different_answers(model, pair):
    clean, corrupted = pair
    with torch.no_grad():
        target = int(_last_logits(model, clean).argmax())
    with pytest.raises(ValueError, match="same token"):
        wb.patch_states(
            model, clean, corrupted, STEPS, metric="logit_diff", target=target,
            corrupted_target=target,
        )  # fmt: skip
    with torch.no_grad():
        corrupted_top = int(_last_logits(model, corrupted).argmax())
    with pytest.raises(ValueError, match="answers do not differ"):
        wb.patch_states(model, clean, corrupted, STEPS, metric="logit_diff", target=corrupted_top)


def test_a_gap_below_min_gap_is_flagged(model, pair):
    df = wb.patch_states(model, *pair, STEPS, positions="all")
    gap = abs(df.attrs["gap"])
    assert not df.gap_too_small.any() if gap >= MIN_GAP else df.gap_too_small.all()
    flagged = wb.patch_states(model, *pair, STEPS, positions="all", min_gap=2 * gap)
    assert flagged.gap_too_small.all() and flagged.attrs["min_gap"] == 2 * gap
    assert not wb.patch_states(
        model, *pair, STEPS, positions="all", min_gap=gap / 2
    ).gap_too_small.any()


def test_progress_reports_every_batch_and_should_stop_cancels(model, pair):
    calls = []
    df = wb.patch_states(
        model, *pair, STEPS, batch_size=4, progress=lambda d, t: calls.append((d, t))
    )
    total = calls[-1][1]
    assert calls[0] == (0, total) and calls[-1] == (total, total) and len(calls) > 2
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    checks = []

    def stop_after_first_batch() -> bool:
        checks.append(1)
        return len(checks) > 1

    with pytest.raises(Cancelled, match="stopped after 4 of"):
        wb.patch_states(model, *pair, STEPS, batch_size=4, should_stop=stop_after_first_batch)
    assert len(df) == 6 * (STEPS + 1)


@pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no default checkpoint")
def test_default_patching_pair_has_a_gap_and_a_grid_with_structure(shipped_model):
    """On the shipped checkpoint the default pair's answers differ (7 against 5) by well over 1
    logit, and the grid is not flat: the operand's and the last position's late states carry it."""
    pair = patching_pair(shipped_model)
    tok = shipped_model.tokenizer
    assert tok.token_strings([pair.target, pair.corrupted_target]) == ["7", "5"]
    steps = 32
    df = wb.patch_states(
        shipped_model, pair.clean_ids, pair.corrupted_ids, steps, metric="logit_diff",
        target=pair.target, corrupted_target=pair.corrupted_target,
    )  # fmt: skip
    assert df.attrs["gap"] >= 1.0 and not df.gap_too_small.any()
    assert df.clean.iloc[0] > 0 > df.corrupted.iloc[0]  # each run prefers its own answer
    with torch.no_grad():
        logits = shipped_model(torch.tensor([pair.clean_ids]), num_steps=steps).logits[0, -1]
    assert int(logits.argmax()) == pair.target
    grid = _grid(df)
    operand = pair.clean_ids.index(tok.encode("4", add_bos=False)[0])
    last = len(pair.clean_ids) - 1
    assert grid.loc[: operand - 1].abs().max().max() == 0  # before the operand: nothing differs
    assert 0.2 < grid.loc[operand, steps] < 0.8 and 0.2 < grid.loc[last, steps] < 0.8
    assert grid.loc[:, : steps - 4].abs().max().max() < 0.1  # an early patch is forgotten


# Steering ----------------------------------------------------------------------------------------
def _vector(model, seed=0):
    return np.random.default_rng(seed).normal(size=model.config.n_embd)


def test_steering_with_zero_alpha_or_zero_vector_is_a_no_op(model, pair):
    ids = pair[0]
    for fn in (
        wb.add_vector_hook(_vector(model), 0.0, (1, 3)),
        wb.add_vector_hook(np.zeros(model.config.n_embd), 5.0, (1, 3)),
        wb.rotate_plane_hook(np.eye(model.config.n_embd)[:2], 0.0, (1, 3)),
    ):
        effect = wb.steering_effect(model, ids, STEPS, [(STATE, fn)])
        assert effect.kl == 0.0 and effect.logprob_change == 0.0
        assert (effect.top_k.baseline_token == effect.top_k.steered_token).all()
    strong = wb.steering_effect(
        model, ids, STEPS, [(STATE, wb.add_vector_hook(_vector(model), 5.0, (1, 3)))]
    )
    assert strong.kl > 1e-3 and strong.logprob_change != 0.0


def test_steering_acts_only_at_the_chosen_iterations(model, pair):
    v = torch.as_tensor(_vector(model), dtype=torch.float32)
    with torch.no_grad():
        _, base = model.run_with_cache(
            pair[0][None], num_steps=STEPS, names_filter=STATE, init_scale=0.0
        )
        with model.hooks([(STATE, wb.add_vector_hook(v, 2.0, (2, 3)))]):
            _, steered = model.run_with_cache(
                pair[0][None], num_steps=STEPS, names_filter=STATE, init_scale=0.0
            )
    s0, s1 = base[STATE], steered[STATE]
    torch.testing.assert_close(s1[:2], s0[:2], rtol=0, atol=0)  # steps 0, 1 untouched
    assert not torch.allclose(s1[2], s0[2])
    # at step 2 the recorded state is the step's output plus 2v
    h = Hook(STATE, 2)
    raw = s1[2] - 2.0 * v
    torch.testing.assert_close(wb.add_vector_hook(v, 2.0, (2, 3))(raw, h), s1[2])


def test_rotation_turns_the_plane_component_and_keeps_the_rest():
    h = 16
    plane = np.random.default_rng(3).normal(size=(2, h))
    x = torch.randn(2, 5, h, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    fn = wb.rotate_plane_hook(plane, np.pi / 2, (1, 1))
    out = fn(x, Hook(STATE, 1))
    u = torch.as_tensor(plane[0] / np.linalg.norm(plane[0]))  # Gram–Schmidt by hand
    w = torch.as_tensor(plane[1]) - (torch.as_tensor(plane[1]) @ u) * u
    q = torch.stack([u, w / w.norm()])
    before, after = x @ q.T, out @ q.T
    torch.testing.assert_close(after[..., 0], -before[..., 1])  # (a, b) -> (−b, a)
    torch.testing.assert_close(after[..., 1], before[..., 0])
    torch.testing.assert_close(out - after @ q, x - before @ q)  # the orthogonal part is untouched
    full = wb.rotate_plane_hook(plane, 2 * np.pi)(x, Hook(STATE, 1))
    torch.testing.assert_close(full, x)
    assert fn(x, Hook(STATE, 2)) is None  # outside the iteration range


def test_directions_difference_of_means_pca_and_plane_vector(model):
    prompts_a, prompts_b = [[5, 6, 7], [9, 10]], [[20, 21, 22, 23]]
    d = wb.difference_of_means(model, prompts_a, prompts_b, STEPS)
    with torch.no_grad():
        last = [
            model.run_with_cache(
                torch.tensor([p]), num_steps=STEPS, names_filter=STATE, init_scale=0.0
            )[1][STATE][STEPS, 0, -1].double()
            for p in prompts_a + prompts_b
        ]
    expected = (last[0] + last[1]) / 2 - last[2]
    np.testing.assert_allclose(d, expected.numpy(), atol=1e-6)

    rng = np.random.default_rng(0)
    axis = np.zeros(8)
    axis[3] = 1.0
    pts = rng.normal(size=(200, 1)) * 10 * axis + rng.normal(size=(200, 8)) * 0.1
    np.testing.assert_allclose(wb.pca_direction(pts), axis, atol=0.02)

    u = wb.plane_vector(np.eye(8)[[1, 4]], np.pi / 3)
    np.testing.assert_allclose(u[[1, 4]].numpy(), [0.5, np.sqrt(3) / 2], atol=1e-12)


def test_generation_honours_steering_hooks(model, pair):
    fn = wb.add_vector_hook(_vector(model), 20.0, (1, 3))
    base, steered = wb.steered_generation(model, pair[0], 5, STEPS, [(STATE, fn)])
    x = pair[0][None]
    with torch.no_grad(), model.hooks([(STATE, fn)]):
        for _ in range(5):  # greedy by full recomputation, the hook active
            nxt = model(x, num_steps=STEPS, init_scale=0.0).logits[:, -1:].argmax(-1)
            x = torch.cat([x, nxt], dim=1)
    assert torch.equal(steered, x)
    assert not torch.equal(steered, base)


# Ablation ----------------------------------------------------------------------------------------
def test_projecting_out_removes_exactly_that_component(model, pair):
    ids, pos = pair[0][None], 3
    plane = random_bases(1, 2, model.config.n_embd, seed=5)[0]
    fn = wb.project_out_hook(plane, positions=[pos])
    # raw = each step's output before the projection (recorded by a hook attached first)
    raw: dict[int, torch.Tensor] = {}

    def record(x, h):
        raw[h.step] = x.clone()

    with torch.no_grad(), model.hooks([(STATE, record)]):
        with model.hooks([(STATE, fn)]):
            _, cache = model.run_with_cache(
                ids, num_steps=STEPS, names_filter=STATE, init_scale=0.0
            )
    q = plane.float()
    states = cache[STATE]
    for step in range(1, STEPS + 1):
        after, before = states[step, 0], raw[step][0]
        assert (after[pos] @ q.T).abs().max() < 1e-5  # nothing left in the plane
        expected = before[pos] - (before[pos] @ q.T) @ q
        torch.testing.assert_close(after[pos], expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(after[:pos], before[:pos], atol=0, rtol=0)  # other positions


def test_random_bases_are_orthonormal():
    q = random_bases(7, 3, 20, seed=1)
    torch.testing.assert_close(q @ q.transpose(1, 2), torch.eye(3).expand(7, 3, 3).double())


def test_ablation_control_spread_over_k_random_planes(model, pair):
    res = wb.ablate_subspace(model, pair[0], 16, position=3, n_random=6)
    assert len(res.control) == 6 and len(res.table) == 7
    assert list(res.table.kind) == ["real"] + ["random"] * 6
    assert res.control_std == pytest.approx(np.std(res.table.effect[1:], ddof=1))
    assert res.control_mean == pytest.approx(np.mean(res.table.effect[1:]))
    below = np.sum(res.control < res.effect) + 0.5 * np.sum(res.control == res.effect)
    assert res.percentile == pytest.approx(100 * below / 6)
    assert (res.table.effect > 0).all()
    # the default plane is the token's rotation plane, fitted on its raw states
    plane = wb.token_rotation_plane(model, pair[0], 16, 3)
    again = wb.ablate_subspace(model, pair[0], 16, position=3, basis=plane, n_random=6)
    assert again.effect == pytest.approx(res.effect, rel=1e-6)
    # ablating a zero-dimensional change: a basis orthogonal to nothing is rejected
    with pytest.raises(ValueError, match="linearly dependent"):
        wb.ablate_subspace(model, pair[0], 16, position=3, basis=np.zeros((2, 64)))


def test_ablation_and_steering_report_the_same_two_measures(model, pair):
    """Both objects carry the last position's KL and the mean KL from the token on, and say which
    one their headline number is; the same hook gives the same numbers through either tool."""
    ids, position, steps = pair[0], 3, 16
    res = wb.ablate_subspace(model, ids, steps, position=position, n_random=4)
    assert res.position == position and "p … T−1" in res.measure
    assert res.effect_last == res.table.kl_last.iloc[0]
    assert list(res.control_last) == list(res.table.kl_last.iloc[1:])
    plane = wb.token_rotation_plane(model, ids, steps, position)
    hook = (STATE, wb.project_out_hook(plane, positions=[position]))
    eff = wb.steering_effect(model, ids, steps, [hook])
    assert "last position" in eff.measure and eff.kl == eff.kl_by_position[-1]
    assert eff.kl_from(position) == pytest.approx(res.effect, rel=1e-5, abs=1e-9)
    # the ablation runs its controls in one batch, steering runs alone: the two forwards round
    # differently (~1e-5 in the logits). The mean above is dominated by the token's own KL (~0.3);
    # the last position's KL is ~1e-4, a squared logit change of ~1e-2, so its relative rounding
    # is ~1e-3 and depends on the CPU's kernels
    assert eff.kl == pytest.approx(res.effect_last, rel=1e-2)
    assert (eff.kl_by_position[:position] == 0).all()  # causal: nothing before the token moves
    assert eff.kl_by_position[position] > 0
    with pytest.raises(ValueError, match="outside"):
        eff.kl_from(len(ids))


def test_ablating_a_direction_batched_equals_one_by_one(model, pair):
    direction = np.random.default_rng(2).normal(size=model.config.n_embd)
    a = wb.ablate_subspace(model, pair[0], STEPS, 2, basis=direction, n_random=4, batch_size=5)
    b = wb.ablate_subspace(model, pair[0], STEPS, 2, basis=direction, n_random=4, batch_size=1)
    np.testing.assert_allclose(a.table.effect, b.table.effect, rtol=1e-4, atol=1e-6)


# Figures -----------------------------------------------------------------------------------------
def test_figures_carry_the_numbers(model, pair):
    from workbench.figures import ablation_control_figure, patching_heatmap, steering_sweep_figure

    # the random tiny model's log-prob gap is below MIN_GAP: min_gap=0 keeps its grid drawn
    df = wb.patch_states(model, *pair, STEPS, positions=[1, 2], min_gap=0.0)
    heat = patching_heatmap(df).data[0]
    np.testing.assert_allclose(np.asarray(heat.z), _grid(df).to_numpy())
    assert heat.zmin == -heat.zmax and len(heat.y) == 2
    everywhere = patching_heatmap(
        wb.patch_states(model, *pair, STEPS, positions="all", min_gap=0.0)
    )
    assert everywhere.data[0].y == ("all positions",)

    sweep = wb.steering_sweep(model, pair[0], STEPS, _vector(model), [0.0, 1.0, 4.0], steps=(1, 2))
    assert sweep.kl[0] == 0.0 and sweep.kl[2] > 0
    fig = steering_sweep_figure(sweep)
    np.testing.assert_allclose(fig.data[0].y, sweep.kl)

    res = wb.ablate_subspace(model, pair[0], 16, position=3, n_random=5)
    hist = ablation_control_figure(res.table)
    np.testing.assert_allclose(hist.data[0].x, res.control)
    assert hist.layout.shapes[0].x0 == pytest.approx(res.effect)
    with pytest.raises(ValueError, match="columns"):
        patching_heatmap(sweep)
