"""The recipe's optimizer, schedule and clipping against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from pretrain.optimizer import ClippedAtanAdam, clip_grads_, global_grad_norm, parameter_groups
from pretrain.schedule import Schedule
from recurrent_model import RecurrentLM, preset


def hand_steps(theta, grads, lr, peak, wd, b1=0.9, b2=0.95):
    """Plain-float reference of the update in pretrain/optimizer.py's docstring, element by element."""
    theta = list(theta)
    m = v = None
    for t, g in enumerate(grads, start=1):
        if m is None:
            m, v = list(g), [x * x for x in g]
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        rms = math.sqrt(sum(gi * gi / max(vi, 1e-12) for gi, vi in zip(g, v)) / len(g))
        lr_eff = lr / max(1.0, rms)
        theta = [x * (1 - (lr / peak) * wd) for x in theta]
        theta = [
            x - lr_eff / (1 - b1**t) * math.atan2(mi, math.sqrt(vi / (1 - b2**t)))
            for x, mi, vi in zip(theta, m, v)
        ]
    return theta


def run_optimizer(theta, grads, lr, peak, wd):
    p = torch.nn.Parameter(torch.tensor(theta, dtype=torch.float64))
    opt = ClippedAtanAdam([p], lr=peak, weight_decay=wd)
    for g in grads:
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return p.detach().tolist()


def test_first_step_by_hand():
    # Step 1: m = g, v = g², rms = 1 (the zero element contributes 0), decay factor 1 − 0.5·0.1,
    # update atan2(g, |g|/sqrt(0.05)) = ±atan(sqrt(0.05)), scaled by lr/(1 − β1) = 1.
    got = run_optimizer([1.0, -2.0, 0.5], [[0.5, -1.0, 0.0]], lr=0.1, peak=0.2, wd=0.1)
    a = math.atan(math.sqrt(0.05))
    assert got == pytest.approx([0.95 - a, -1.9 + a, 0.475], abs=1e-12)


def test_two_steps_with_update_clipping_match_reference():
    grads = [[0.5, -1.0, 0.0], [5.0, 0.0, 0.2]]  # the 5.0 spike makes rms > 1: clipped lr
    got = run_optimizer([1.0, -2.0, 0.5], grads, lr=0.1, peak=0.2, wd=0.1)
    want = hand_steps([1.0, -2.0, 0.5], grads, lr=0.1, peak=0.2, wd=0.1)
    assert got == pytest.approx(want, abs=1e-12)
    unclipped = hand_steps([1.0, -2.0, 0.5], grads[:1], lr=0.1, peak=0.2, wd=0.1)
    assert abs(got[0] - unclipped[0]) < 0.1 / (1 - 0.9**2)  # clipping shrank the step


def test_moments_start_from_first_gradient():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = ClippedAtanAdam([p], lr=1e-3)
    p.grad = torch.tensor([1.0, -2.0, 3.0])
    opt.step()
    state = opt.state[p]
    torch.testing.assert_close(state["exp_avg"], p.grad)  # β·g + (1 − β)·g, up to rounding
    torch.testing.assert_close(state["exp_avg_sq"], p.grad**2)


def test_parameter_groups_decay_matrices_and_embedding_only():
    model = RecurrentLM(preset("tiny"))
    groups = parameter_groups(model, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)] for p in groups[0]["params"]}
    no_decay = {names[id(p)] for p in groups[1]["params"]}
    assert "transformer.wte.weight" in decay and "transformer.adapter.weight" in decay
    assert any(n.endswith("mlp.fc.weight") for n in decay)
    assert all(".norm_" in n or "ln_f" in n or n.endswith("qk_bias") for n in no_decay)
    assert any(n.endswith("qk_bias") for n in no_decay)
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    total = sum(p.numel() for g in groups for p in g["params"])
    assert total == model.num_parameters()  # tied head counted once


def test_schedule_reaches_every_group():
    s = Schedule(peak_lr=1.0, warmup_steps=4, total_steps=20, cooldown_steps=5, min_lr_ratio=0.1)
    assert [s.factor(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.factor(10) == 1.0
    assert s.factor(15) == pytest.approx(1 - 0.9 * 1 / 5)
    assert s.factor(19) == pytest.approx(0.1)
    model = RecurrentLM(preset("tiny"))
    opt = ClippedAtanAdam(parameter_groups(model, 0.1), lr=1.0)
    s.apply(opt, 1)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.5]
    assert all(g["peak_lr"] == 1.0 for g in opt.param_groups)


def test_global_norm_clipping_and_nonfinite_detection():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    norm = global_grad_norm([a, b])
    assert norm == pytest.approx(5.0)
    clip_grads_([a, b], 1.0, norm)
    assert global_grad_norm([a, b]) == pytest.approx(1.0, rel=1e-5)
    b.grad = torch.tensor([float("nan")])
    assert not math.isfinite(global_grad_norm([a, b]))
