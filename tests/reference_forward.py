"""An independent, deliberately plain implementation of the published forward pass, written from
the architecture's description with different code paths (complex-number RoPE, explicit softmax attention),
used to check RecurrentLM number for number."""

from __future__ import annotations

import math

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 / torch.sqrt((x32 * x32).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope_complex(x: torch.Tensor, base: float) -> torch.Tensor:
    """x (B, T, H, D): pairs (2j, 2j+1) as complex numbers times exp(i · pos · base^(−2j/D))."""
    B, T, H, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    pos = torch.arange(T, dtype=torch.float64)
    angles = pos[:, None] * base ** (-2.0 * j / D)[None, :]
    rot = torch.polar(torch.ones_like(angles), angles)  # (T, D/2) complex128
    xc = torch.view_as_complex(x.double().reshape(B, T, H, D // 2, 2).contiguous())
    out = torch.view_as_real(xc * rot[None, :, None, :]).reshape(B, T, H, D)
    return out.to(x.dtype)


def layer(sd: dict, prefix: str, x: torch.Tensor, n_heads: int, base: float, eps: float):
    B, T, h = x.shape
    d = h // n_heads
    w = lambda name: sd[f"{prefix}.{name}"]  # noqa: E731
    # attention sub-layer
    y = rms_norm(x, w("norm_1.weight"), eps)
    qkv = y @ w("attn.Wqkv.weight").T
    q, k, v = qkv[..., :h], qkv[..., h : 2 * h], qkv[..., 2 * h :]
    q = q.reshape(B, T, n_heads, d) + w("attn.qk_bias")[0, 0]
    k = k.reshape(B, T, n_heads, d) + w("attn.qk_bias")[1, 0]
    v = v.reshape(B, T, n_heads, d)
    q, k = rope_complex(q, base), rope_complex(k, base)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    att = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(B, T, h)
    x = rms_norm(x + att @ w("attn.proj.weight").T, w("norm_2.weight"), eps)
    # MLP sub-layer
    y = rms_norm(x, w("norm_3.weight"), eps)
    fc = y @ w("mlp.fc.weight").T
    inner = fc.shape[-1] // 2
    gate, up = fc[..., :inner], fc[..., inner:]
    m = (torch.nn.functional.silu(gate) * up) @ w("mlp.proj.weight").T
    return rms_norm(x + m, w("norm_4.weight"), eps)


def reference_forward(model, input_ids: torch.Tensor, num_steps: int, s0: torch.Tensor):
    """Logits (float32) and every state s_0 … s_r, per the spec, from the model's state_dict alone."""
    cfg = model.config
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    run = lambda p, x: layer(sd, p, x, cfg.n_heads, cfg.rope_base, cfg.norm_eps)  # noqa: E731
    x = sd["transformer.wte.weight"][input_ids] * math.sqrt(cfg.n_embd)
    for i in range(cfg.n_layers_in_prelude):
        x = run(f"transformer.prelude.{i}", x)
    e = x
    states = [s0]
    s = s0
    for _ in range(num_steps):
        x = torch.cat([s, e], dim=-1) @ sd["transformer.adapter.weight"].T
        for j in range(cfg.n_layers_in_recurrent_block):
            x = run(f"transformer.core_block.{j}", x)
        s = x
        states.append(s)
    x = rms_norm(s, sd["transformer.ln_f.weight"], cfg.norm_eps)
    for k in range(cfg.n_layers_in_coda):
        x = run(f"transformer.coda.{k}", x)
    x = rms_norm(x, sd["transformer.ln_f.weight"], cfg.norm_eps)
    logits = (x @ sd["transformer.wte.weight"].T).float()
    return logits, torch.stack(states)
