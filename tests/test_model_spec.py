"""One test per fact of the published architecture (Huginn-0125), checked against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
from reference_forward import reference_forward

import recurrent_model as rm
from recurrent_model import hook_names
from recurrent_model.layers import (
    Attention,
    GatedMLP,
    RMSNorm,
    SandwichBlock,
    apply_rope,
    rope_table,
)


def tiny(**overrides) -> rm.RecurrentLM:
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny", **overrides)).eval()
    with torch.no_grad():  # non-trivial norms and biases so misplacements show
        for name, p in model.named_parameters():
            if "norm" in name or "ln_f" in name:
                p.uniform_(0.5, 1.5)
            elif "qk_bias" in name:
                p.normal_(0, 0.1)
    return model


def test_rope_rotates_interleaved_pairs_by_hand_computed_angle():
    head_dim, base, pos = 8, 50000.0, 3
    x = torch.zeros(1, pos + 1, 1, head_dim)
    x[0, pos, 0] = torch.arange(1.0, head_dim + 1)  # pairs (1,2), (3,4), (5,6), (7,8)
    out = apply_rope(x, rope_table(head_dim, pos + 1, base))[0, pos, 0]
    for j in range(head_dim // 2):
        angle = pos * base ** (-2 * j / head_dim)
        a, b = 2.0 * j + 1, 2.0 * j + 2
        expected = (
            a * math.cos(angle) - b * math.sin(angle),
            a * math.sin(angle) + b * math.cos(angle),
        )
        assert out[2 * j].item() == pytest.approx(expected[0], abs=1e-5)
        assert out[2 * j + 1].item() == pytest.approx(expected[1], abs=1e-5)


def test_rope_is_not_rotate_half_and_position_zero_is_identity():
    x = torch.randn(1, 4, 2, 8)
    table = rope_table(8, 4, 50000.0)
    out = apply_rope(x, table)
    assert torch.equal(out[:, 0], x[:, 0])
    # Rotating only dimension 0 must move energy into dimension 1 (its pair), not dimension 4.
    e0 = torch.zeros(1, 2, 1, 8)
    e0[..., 0] = 1.0
    moved = apply_rope(e0, rope_table(8, 2, 10.0))[0, 1, 0]
    assert moved[1].abs() > 0.5 and moved[4] == 0


def test_rms_norm_formula_and_float32_computation():
    norm = RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 7.0))
    x = torch.randn(3, 6)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=1e-6, atol=1e-6)
    xb = x.bfloat16()
    assert norm.to(torch.bfloat16)(xb).dtype == torch.bfloat16


def test_attention_fused_qkv_order_and_qk_bias_before_rope():
    cfg = rm.preset("tiny")
    torch.manual_seed(1)
    attn = Attention(cfg)
    with torch.no_grad():
        attn.Wqkv.weight.normal_(0, 0.2)
        attn.proj.weight.normal_(0, 0.2)
        attn.qk_bias.normal_(0, 0.5)
    x = torch.randn(2, 5, cfg.n_embd)
    h, H, d = cfg.n_embd, cfg.n_heads, cfg.head_dim
    W = attn.Wqkv.weight
    q = (x @ W[:h].T).view(2, 5, H, d) + attn.qk_bias[0]
    k = (x @ W[h : 2 * h].T).view(2, 5, H, d) + attn.qk_bias[1]
    v = (x @ W[2 * h :].T).view(2, 5, H, d)
    table = rope_table(d, 5, cfg.rope_base)
    q, k = apply_rope(q, table), apply_rope(k, table)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    y = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(2, 5, h)
    expected = y @ attn.proj.weight.T
    with torch.no_grad():
        torch.testing.assert_close(attn(x, table), expected, rtol=1e-5, atol=1e-5)
        # Bias added after RoPE would give a different result: the test can tell them apart.
        q_late = apply_rope((x @ W[:h].T).view(2, 5, H, d), table) + attn.qk_bias[0]
        assert not torch.allclose(q_late, q, atol=1e-3)


def test_gated_mlp_first_half_is_the_silu_gate():
    cfg = rm.preset("tiny")
    mlp = GatedMLP(cfg)
    x = torch.randn(3, cfg.n_embd)
    fc = x @ mlp.fc.weight.T
    I = cfg.intermediate_size
    expected = (torch.nn.functional.silu(fc[:, :I]) * fc[:, I:]) @ mlp.proj.weight.T
    torch.testing.assert_close(mlp(x), expected.detach(), rtol=1e-5, atol=1e-6)


def test_sandwich_norm_placement():
    cfg = rm.preset("tiny")
    block = SandwichBlock(cfg, "probe")
    with torch.no_grad():
        for i, norm in enumerate((block.norm_1, block.norm_2, block.norm_3, block.norm_4)):
            norm.weight.fill_(1.0 + i)
    x = torch.randn(2, 4, cfg.n_embd)
    table = rope_table(cfg.head_dim, 4, cfg.rope_base)
    with torch.no_grad():
        mid = block.norm_2(x + block.attn(block.norm_1(x), table))
        expected = block.norm_4(mid + block.mlp(block.norm_3(mid)))
        torch.testing.assert_close(block(x, table), expected, rtol=0, atol=0)


def test_whole_forward_matches_independent_reference():
    model = tiny()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    s0 = model.initial_state(
        torch.zeros(2, 9, model.config.n_embd), 1.0, torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, num_steps=5, init_state=s0)
        ref_logits, ref_states = reference_forward(model, ids, 5, s0)
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(cache[hook_names.STATE], ref_states, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)


def test_adapter_concat_order_is_state_then_embedding():
    model = tiny()
    h = model.config.n_embd
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    seen = {}
    with torch.no_grad():
        model.transformer.adapter.weight.zero_()
        model.transformer.adapter.weight[:, :h] = torch.eye(h)  # keep only the state half
        s0 = torch.randn(1, 6, h)
        with model.hooks([(hook_names.ADAPTER, lambda x, hook: seen.setdefault("a", x.clone()))]):
            model(ids, num_steps=1, init_state=s0)
    torch.testing.assert_close(seen["a"], s0)


def test_embedding_scaled_by_sqrt_h_and_head_tied():
    model = tiny()
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    _, cache = model.run_with_cache(
        ids, num_steps=1, names_filter=[hook_names.EMBED, hook_names.FINAL_NORM]
    )
    expected = model.transformer.wte.weight[ids] * math.sqrt(model.config.n_embd)
    torch.testing.assert_close(cache[hook_names.EMBED], expected.detach())
    assert model.lm_head.weight is model.transformer.wte.weight
    # ln_f is applied twice: latents = ln_f(s_r), and the head reads ln_f(coda output).
    out, cache = model.run_with_cache(ids, num_steps=2, init_scale=0.0)
    torch.testing.assert_close(out.latents, model.transformer.ln_f(out.state).detach())
    torch.testing.assert_close(
        out.logits, (cache[hook_names.FINAL_NORM] @ model.transformer.wte.weight.T).detach()
    )


def test_initial_state_variance_is_two_fifths_after_scaling():
    h = 256
    model = rm.RecurrentLM(rm.preset("tiny", n_embd=h, n_heads=4), init_weights=False)
    e = torch.empty(64, 64, h)
    s0 = model.initial_state(e, 1.0, torch.Generator().manual_seed(0))
    sigma = math.sqrt(2 / (5 * h))
    # Truncation at ±3σ keeps a factor 1 − 6φ(3)/(Φ(3) − Φ(−3)) of the variance.
    phi3 = math.exp(-4.5) / math.sqrt(2 * math.pi)
    mass = math.erf(3 / math.sqrt(2))
    expected_var = 0.4 * (1 - 6 * phi3 / mass)
    assert s0.var().item() == pytest.approx(expected_var, rel=0.01)
    assert s0.abs().max().item() <= 3 * sigma * math.sqrt(h) + 1e-6
    half = model.initial_state(e, 0.5, torch.Generator().manual_seed(0))
    assert half.var().item() == pytest.approx(expected_var / 4, rel=0.01)


def test_init_scale_zero_gives_exact_zeros_and_deterministic_runs():
    model = tiny()
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    out, cache = model.run_with_cache(ids, num_steps=3, init_scale=0.0)
    assert torch.count_nonzero(cache[hook_names.STATE][0]) == 0
    again = model(ids, num_steps=3, init_scale=0.0)
    assert torch.equal(out.logits, again.logits)


def test_fixed_init_state_and_seeded_generator_are_bit_stable():
    model = tiny()
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    s0 = torch.randn(2, 7, model.config.n_embd)
    a = model(ids, num_steps=4, init_state=s0).logits
    b = model(ids, num_steps=4, init_state=s0.clone()).logits
    assert torch.equal(a, b)
    g = lambda: torch.Generator().manual_seed(11)  # noqa: E731
    assert torch.equal(model(ids, 4, generator=g()).logits, model(ids, 4, generator=g()).logits)
    assert not torch.equal(model(ids, 4).logits, model(ids, 4).logits)  # fresh noise differs


def test_num_steps_default_is_mean_recurrence_and_core_is_shared():
    model = tiny()
    ids = torch.randint(0, model.config.vocab_size, (1, 4))
    out = model(ids, init_scale=0.0)
    assert out.num_steps == model.config.mean_recurrence
    # One parameter set serves every iteration: the core has l_R layers, not l_R · r.
    assert len(model.transformer.core_block) == model.config.n_layers_in_recurrent_block


def test_takase_initialisation_statistics():
    cfg = rm.preset("tiny", n_embd=256, n_heads=4, intermediate_size=512, vocab_size=2048)
    model = rm.RecurrentLM(cfg)
    sigma = math.sqrt(2 / (5 * 256))
    out_sigma = sigma / math.sqrt(2 * cfg.effective_depth)
    trunc = math.sqrt(
        1 - 6 * (math.exp(-4.5) / math.sqrt(2 * math.pi)) / math.erf(3 / math.sqrt(2))
    )
    t = model.transformer
    assert t.wte.weight.std().item() == pytest.approx(sigma * trunc, rel=0.02)
    assert t.core_block[0].attn.Wqkv.weight.std().item() == pytest.approx(sigma * trunc, rel=0.02)
    assert t.core_block[0].attn.proj.weight.std().item() == pytest.approx(
        out_sigma * trunc, rel=0.03
    )
    assert t.prelude[0].mlp.proj.weight.std().item() == pytest.approx(out_sigma * trunc, rel=0.03)
    assert t.prelude[0].attn.Wqkv.weight.abs().max().item() <= 3 * sigma
    assert torch.all(t.core_block[1].norm_3.weight == 1) and torch.all(t.ln_f.weight == 1)
    assert torch.count_nonzero(t.coda[0].attn.qk_bias) == 0


def test_published_shape_parameter_counts():
    cfg = rm.preset("huginn-0125")
    assert cfg.effective_depth == 132 and cfg.head_dim == 96
    with torch.device("meta"):
        model = rm.RecurrentLM(cfg, init_weights=False)
    assert model.num_parameters() == 3_564_976_800
    assert model.num_parameters("core_block") == model.num_parameters("core") == 1_581_592_320
    with pytest.raises(ValueError, match="unknown part"):
        model.num_parameters("cores")
    assert sum(p.numel() for p in model.transformer.prelude[0].parameters()) == 395_398_080


def test_context_length_is_enforced():
    model = tiny()
    ids = torch.zeros(1, model.config.block_size + 1, dtype=torch.long)
    with pytest.raises(rm.ContextLengthError, match="exceeds the model's context"):
        model(ids, num_steps=1)
