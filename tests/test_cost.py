"""The cost model (recurrent_model/cost.py) against the model's own tensors, and the speed probe."""

from __future__ import annotations

import pytest
import torch

import recurrent_model as rm
from recurrent_model import speed


def _linear_numel(module: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("name", ["tiny", "small", "huginn-0125"])
def test_parameter_counts_match_the_built_model(name):
    config = rm.preset(name)
    with torch.device("meta"):
        model = rm.RecurrentLM(config, init_weights=False)
    cost = config.cost
    assert cost.parameters == model.num_parameters()
    assert cost.block_params == sum(p.numel() for p in model.transformer.core_block[0].parameters())
    assert cost.block_matmul_params == _linear_numel(model.transformer.core_block[0])
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert shapes == set(cost.weight_shapes().values())


def test_forward_flops_count_every_matmul_and_causal_attention_once():
    config = rm.preset("tiny")
    model = rm.RecurrentLM(config)
    t, r, context = 7, 3, 5
    t_ = model.transformer
    once = _linear_numel(t_.prelude) + _linear_numel(t_.coda) + model.lm_head.weight.numel()
    iterated = _linear_numel(t_.core_block) + t_.adapter.weight.numel()
    layers = config.n_layers_in_prelude + config.n_layers_in_coda
    layers += r * config.n_layers_in_recurrent_block
    keys = sum(context + i + 1 for i in range(t))  # query i sees the cache and keys 0 … i
    attention = layers * keys * 4 * config.n_embd
    expected = 2 * t * (once + r * iterated) + attention
    assert config.cost.forward_flops(t, r, context=context) == expected
    assert config.cost.layer_calls(r) == layers
    # average attended length (T + 1) / 2 without a cache
    assert config.cost.layer_attention_flops(t) == 4 * config.n_embd * t * (t + 1) / 2
    # decoding n tokens one by one costs what one chunk of n after the same context costs
    steps = sum(config.cost.forward_flops(1, r, context=context + i) for i in range(t))
    assert steps == pytest.approx(expected)
    with pytest.raises(ValueError):
        config.cost.forward_flops(0, r)


def test_training_flops_are_the_forward_plus_twice_the_carried_part():
    cost = rm.preset("small").cost
    T, r, k = 64, 12, 4
    per_token = cost.train_flops_per_token(T, r, k)
    assert per_token == pytest.approx((cost.forward_flops(T, r) + 2 * cost.forward_flops(T, k)) / T)
    # full backprop: three forwards
    assert cost.train_flops_per_token(T, r, r) == pytest.approx(
        3 * cost.forward_flops_per_token(T, r)
    )
    with pytest.raises(ValueError):
        cost.train_flops_per_token(T, 2, 3)


def test_decode_bytes_are_the_weights_read_and_the_cache():
    config = rm.preset("tiny")
    model = rm.RecurrentLM(config)
    t_, r = model.transformer, 4
    once = _linear_numel(t_.prelude) + _linear_numel(t_.coda) + model.lm_head.weight.numel()
    iterated = _linear_numel(t_.core_block) + t_.adapter.weight.numel()
    assert config.cost.decode_weight_bytes(r, torch.bfloat16) == 2 * (once + r * iterated)
    kv = 2 * config.n_embd * 4 * (10 + 1) * config.cost.layer_calls(r)
    assert config.cost.decode_cache_bytes(10, r, "float32") == kv
    assert config.cost.decode_bytes_per_token(10, r, "float32") == 4 * (once + r * iterated) + kv


def test_probe_times_the_models_own_products_and_records_when():
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    speed.forget()
    first = speed.linear_speed(model, rows=12, budget_s=0.05)
    assert first.flops_per_second >= speed.FLOOR_FLOPS
    own = [tuple(w.shape) for w in speed.probe_weights(model)]
    # the model's own weights, each cut to fewer output rows only when the budget needs it
    assert [s[1] for s in first.shapes] == [s[1] for s in own]
    assert all(s[0] <= o[0] for s, o in zip(first.shapes, own))
    assert first.dtype == "float32" and first.device == "cpu" and first.rows == 12
    assert first.seconds < 1.0 and first.age() < 60
    assert "GFLOP/s" in first.describe() and "load" in first.describe()
    assert speed.linear_speed(model, rows=9, budget_s=0.05) is first  # same bucket, fresh
    assert first.stale(now=first.measured_at + speed.MAX_AGE_S + 1, load=first.load)
    assert first.stale(now=first.measured_at + speed.MIN_AGE_S + 1, load=first.load + 2)
    assert not first.stale(now=first.measured_at + 1, load=first.load + 2)


def test_probe_remeasures_when_stale_and_runs_bfloat16(monkeypatch):
    model = rm.RecurrentLM(rm.preset("tiny")).eval().to(torch.bfloat16)
    speed.forget()
    first = speed.linear_speed(model, rows=4, budget_s=0.05)
    assert first.dtype == "bfloat16"
    monkeypatch.setattr(speed.Speed, "stale", lambda self, now=None, load=None: True)
    assert speed.linear_speed(model, rows=4, budget_s=0.05) is not first
    config = rm.preset("small")
    alone = speed.linear_speed(config=config, dtype="bfloat16", rows=8, budget_s=0.05)
    assert alone.dtype == "bfloat16" and alone.flops_per_second > 0
    assert (
        speed.format_gflops(2.5e8) == "0.25 GFLOP/s" and speed.format_gflops(3e10) == "30 GFLOP/s"
    )


def test_the_plan_counts_parameters_with_the_cost_model():
    from pretrain.plan import count_parameters

    config = rm.preset("small")
    with torch.device("meta"):
        model = rm.RecurrentLM(config, init_weights=False)
    counts = count_parameters(config)
    assert counts.total == model.num_parameters()
    assert counts.largest_tensor == max(p.numel() for p in model.parameters())
    per_block = [sum(p.numel() for p in b.parameters()) for b in model.blocks()]
    assert [*counts.prelude_blocks, *counts.core_blocks, *counts.coda_blocks] == per_block


def test_a_large_product_is_cut_to_the_budget_not_its_rows():
    weight = torch.randn(4096, 2048)
    timed = speed.measure([weight], rows=512, budget_s=0.05)
    assert timed.rows == 512 and timed.shapes[0][1] == 2048  # the model's rows and in-dimension
    assert timed.shapes[0][0] < 4096 and timed.seconds < 2.0


def test_trajectory_bytes_counts_every_state_of_every_position():
    cost = rm.preset("huginn-0125").cost
    assert cost.trajectory_bytes(64, 32) == 64 * 33 * 5280 * 4
    assert cost.trajectory_bytes(64, 32, "bfloat16") == 64 * 33 * 5280 * 2
