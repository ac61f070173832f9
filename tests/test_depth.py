"""The training-time depth: log-normal Poisson sampler, lock-step seeding and truncated backprop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import recurrent_model as rm
from recurrent_model import hook_names
from recurrent_model.depth import draw_depths


def mixture_cdf(n: np.ndarray, mean: float, sigma: float) -> np.ndarray:
    """P(r ≤ n) for r = Poisson(e^τ) + 1, τ ~ N(log mean − σ²/2, σ), by Gauss–Hermite quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    mu = math.log(mean) - sigma**2 / 2
    lam = np.exp(mu + sigma * nodes)
    cdf = stats.poisson.cdf(np.asarray(n)[:, None] - 1, lam[None, :])
    return cdf @ weights / weights.sum()


def test_sampler_matches_closed_form_log_normal_poisson():
    draws = draw_depths(32, 100_000, np.random.default_rng(0))
    sigma = 0.5
    # E[r] = r̄ + 1;  Var[r] = r̄ + r̄²(e^{σ²} − 1)
    assert draws.mean() == pytest.approx(33.0, rel=0.01)
    assert draws.std() == pytest.approx(math.sqrt(32 + 32**2 * (math.exp(sigma**2) - 1)), rel=0.02)
    grid = np.arange(1, 200)
    cdf = mixture_cdf(grid, 32, sigma)
    for q in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99):
        expected = grid[np.searchsorted(cdf, q)]
        assert abs(np.quantile(draws, q) - expected) <= max(1.0, 0.03 * expected), q
    assert np.median(draws) == pytest.approx(29, abs=1)
    assert np.quantile(draws, 0.99) == pytest.approx(94, rel=0.05)
    assert draws.min() >= 1


def test_split_depth_no_grad_then_grad():
    assert rm.split_depth(20, 8) == rm.Depth(12, 8)
    assert rm.split_depth(5, 8) == rm.Depth(0, 5)
    assert rm.split_depth(5, None) == rm.Depth(0, 5)
    assert rm.split_depth(0, 8).total == 0
    with pytest.raises(ValueError):
        rm.split_depth(-1, 8)


def test_same_seed_and_step_give_same_depth_on_every_rank():
    a = [rm.sample_depth(step, 32, 8, seed=7) for step in range(50)]
    b = [rm.sample_depth(step, 32, 8, seed=7) for step in range(50)]
    assert a == b
    assert len({d.total for d in a}) > 10  # it does vary across steps
    assert [rm.sample_depth(s, 32, 8, seed=8) for s in range(50)] != a
    assert all(d.grad == min(d.total, 8) for d in a)


def test_gradient_reaches_only_last_k_iterations_but_e_always():
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    states = []
    with model.hooks([(hook_names.STATE, lambda x, hook: states.append((hook.step, x)))]):
        out = model(ids, num_steps=6, backprop_depth=2, labels=ids)
    out.loss.backward()
    grad_flags = {step: x.requires_grad for step, x in states}
    assert grad_flags == {0: False, 1: False, 2: False, 3: False, 4: False, 5: True, 6: True}
    assert model.transformer.prelude[0].attn.Wqkv.weight.grad.abs().sum() > 0  # e gets gradient
    assert model.transformer.adapter.weight.grad.abs().sum() > 0


def test_training_mode_defaults_to_mean_backprop_depth():
    model = rm.RecurrentLM(rm.preset("tiny", mean_backprop_depth=1)).train()
    ids = torch.randint(0, model.config.vocab_size, (1, 4))
    flags = []
    with model.hooks([(hook_names.STATE, lambda x, hook: flags.append(x.requires_grad))]):
        model(ids, num_steps=3)
    assert flags == [False, False, False, True]


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 8))

    def grads(ckpt: bool) -> list[torch.Tensor]:
        model.zero_grad()
        model.activation_checkpointing = ckpt
        model(ids, num_steps=4, backprop_depth=3, labels=ids, init_scale=0.0).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    for a, b in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
