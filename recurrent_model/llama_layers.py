"""Llama-style arithmetic that the Ouro and retrofitted families share: rotate-half RoPE, causal
grouped-query attention (optionally within a sliding window, optionally over a KV cache), the
SwiGLU MLP and the float32 RMSNorm of the Hugging Face Llama code.

Huginn's own layers (interleaved RoPE, fused qkv with a per-head bias, sandwich norms) live in
:mod:`recurrent_model.functional`; the two RoPE forms pair different dimensions and must not be
mixed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight · (x / sqrt(mean(x²) + eps)), the mean in float32, cast back to x's dtype before the
    weight multiplies (Llama's ``LlamaRMSNorm``)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


class RMSNorm(nn.Module):
    """:func:`rms_norm` with a learned weight (init 1)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_table(head_dim: int, length: int, base: float, device=None) -> torch.Tensor:
    """cos and sin of rotate-half RoPE for positions 0 … length − 1, stacked: (2, length, head_dim)
    float32. Frequencies base^(−2j/head_dim) for j < head_dim/2, each used for dims j and
    j + head_dim/2."""
    inv_freq = 1.0 / base ** (
        torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    )
    positions = torch.arange(length, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((angles.cos(), angles.sin()))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, D) rotated by ``rope`` (2, T, D) from :func:`rope_table`, in x's dtype."""
    cos, sin = rope[0].to(x.dtype), rope[1].to(x.dtype)
    return x * cos + rotate_half(x) * sin


class SlotCache:
    """Keys and values per cache slot (one slot per layer call: Ouro has one per (loop, layer)),
    each (B, kv_heads, positions, D), grown as tokens arrive. A forward over a chunk says where the
    chunk starts (:meth:`begin`); a slot that does not hold exactly the positions before it (a chunk
    that runs more or fewer loops than the chunks before) is an error, not attention over a part of
    the sequence."""

    def __init__(self) -> None:
        self.slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.start = 0

    def begin(self, start: int) -> None:
        """The next chunk's first position: every slot it extends must hold ``start`` positions."""
        self.start = int(start)

    def extend(
        self, slot: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values to ``slot``; every key and value the slot holds."""
        held = self.slots.get(slot)
        cached = 0 if held is None else held[0].shape[2]
        if cached != self.start:
            raise ValueError(
                f"KV cache slot {slot} holds {cached} positions but this chunk starts at position "
                f"{self.start}: every chunk must run the same number of steps"
            )
        if held is not None:
            k, v = torch.cat((held[0], k), dim=2), torch.cat((held[1], v), dim=2)
        self.slots[slot] = (k, v)
        return k, v


def attention_mask(
    queries: int, keys: int, window: int | None, device: torch.device
) -> torch.Tensor | None:
    """Which keys each of the last ``queries`` of ``keys`` positions sees (bool, True = attend):
    itself and every earlier key, within ``window`` positions (itself included) when one is set.
    None where plain causal attention says the same."""
    if window is None and queries == keys:
        return None
    q = torch.arange(keys - queries, keys, device=device)[:, None]
    k = torch.arange(keys, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    return allowed


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: torch.Tensor,
    window: int | None = None,
    cache: tuple[SlotCache, int] | None = None,
) -> torch.Tensor:
    """Causal grouped-query attention of q (B, heads, T, D) over k, v (B, kv_heads, T, D), scale
    1/sqrt(D), after rotate-half RoPE; ``cache`` (cache, slot) prepends the slot's earlier keys.
    Returns (B, T, heads · D)."""
    q, k = apply_rope(q, rope), apply_rope(k, rope)
    if cache is not None:
        k, v = cache[0].extend(cache[1], k, v)
    B, heads, T, D = q.shape
    mask = attention_mask(T, k.shape[2], window, q.device)
    gqa = heads != k.shape[1]
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, enable_gqa=gqa
    )
    return y.transpose(1, 2).reshape(B, T, heads * D)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, heads · D) -> (B, heads, T, D)."""
    B, T, _ = x.shape
    return x.view(B, T, heads, -1).transpose(1, 2)


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SiLU(x Wgateᵀ) · (x Wupᵀ), before the down projection."""
    return F.silu(F.linear(x, gate)) * F.linear(x, up)
