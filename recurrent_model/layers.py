"""The building blocks of the recurrent-depth model, exactly as published.

Every layer is a "sandwich" block: ``x = norm_2(x + Attn(norm_1(x)))``, ``x = norm_4(x + MLP(norm_3(x)))``.
Attention uses a fused [Q; K; V] projection, a learned per-head bias on queries and keys added before
interleaved-pair RoPE, and torch's scaled_dot_product_attention.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import RecurrentConfig
from .hooks import HookPoint


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) in float32, cast back to the input dtype, times a learned weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # torch's fused kernel computes exactly this formula
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_table(head_dim: int, length: int, base: float, device=None) -> torch.Tensor:
    """RoPE rotations as unit complex numbers (complex64), shape (length, head_dim // 2).

    Pair j of a head (dimensions 2j, 2j+1) at position p is rotated by p · base^(−2j/head_dim).
    """
    exponents = torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    positions = torch.arange(length, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq).float()
    return torch.complex(torch.cos(angles), torch.sin(angles))


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` (B, T, ..., head_dim) by ``table`` (T, head_dim // 2).

    Each pair (a, b) is the complex number a + ib, multiplied by cos + i·sin in float32:
    (a, b) -> (a·cos − b·sin, b·cos + a·sin); cast back to x's dtype.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    rot = table.view(table.shape[0], *([1] * (x.dim() - 3)), table.shape[-1])
    if torch.compiler.is_compiling():  # inductor fuses real arithmetic but not complex ops
        a, b = pairs[..., 0], pairs[..., 1]
        cos, sin = rot.real, rot.imag
        rotated = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1)
        return rotated.flatten(-2).type_as(x)
    if pairs.stride(-1) != 1:
        pairs = pairs.contiguous()
    return torch.view_as_real(torch.view_as_complex(pairs) * rot).flatten(-2).type_as(x)


class KVCacheSlot(Protocol):
    """What attention needs from a KV cache: store this call's keys/values, return what to attend to.

    ``update`` receives k and v as (B, heads, T_new, head_dim) and returns the keys and values to attend
    over plus an optional boolean attention mask (True = attend); a None mask means plain causal.
    """

    def update(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...


class Attention(nn.Module):
    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__()
        h = config.n_embd
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.Wqkv = nn.Linear(h, 3 * h, bias=False)
        self.qk_bias = nn.Parameter(torch.zeros(2, 1, config.n_heads, config.head_dim))
        self.proj = nn.Linear(h, h, bias=False)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, cache: KVCacheSlot | None = None
    ) -> torch.Tensor:
        B, T, h = x.shape
        qkv = self.Wqkv(x)
        # Queries and keys together: per-head bias, then RoPE (one op each); values untouched.
        qk = qkv[..., : 2 * h].view(B, T, 2, self.n_heads, self.head_dim)
        qk = apply_rope(qk + self.qk_bias.view(2, self.n_heads, self.head_dim), rope)
        q = qk[:, :, 0].transpose(1, 2)
        k = qk[:, :, 1].transpose(1, 2)
        v = qkv[..., 2 * h :].view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k, v, mask = cache.update(k, v)
            if mask is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, h))


class GatedMLP(nn.Module):
    """One fc projection to 2·I, split: SiLU(first half) · second half, then proj back to h."""

    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class SandwichBlock(nn.Module):
    """One decoder layer with a norm before and after each sub-layer, and hooks on its activations."""

    def __init__(self, config: RecurrentConfig, name: str, iterated: bool = False) -> None:
        super().__init__()
        eps = config.norm_eps
        self.norm_1 = RMSNorm(config.n_embd, eps)
        self.attn = Attention(config)
        self.norm_2 = RMSNorm(config.n_embd, eps)
        self.norm_3 = RMSNorm(config.n_embd, eps)
        self.mlp = GatedMLP(config)
        self.norm_4 = RMSNorm(config.n_embd, eps)
        self.hook_attn_out = HookPoint(f"{name}.hook_attn_out", iterated)
        self.hook_resid_mid = HookPoint(f"{name}.hook_resid_mid", iterated)
        self.hook_mlp_out = HookPoint(f"{name}.hook_mlp_out", iterated)
        self.hook_resid_post = HookPoint(f"{name}.hook_resid_post", iterated)

    def hook_points(self) -> list[HookPoint]:
        return [self.hook_attn_out, self.hook_resid_mid, self.hook_mlp_out, self.hook_resid_post]

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        step: int | None = None,
        cache: KVCacheSlot | None = None,
    ) -> torch.Tensor:
        attn_out = self.hook_attn_out(self.attn(self.norm_1(x), rope, cache), step)
        x = self.hook_resid_mid(self.norm_2(attn_out + x), step)
        mlp_out = self.hook_mlp_out(self.mlp(self.norm_3(x)), step)
        return self.hook_resid_post(self.norm_4(mlp_out + x), step)
