"""The pieces of a RecurrentLM forward pass run over a :class:`KVCache`, one chunk of positions at a time.

Two interchangeable paths:
- fast: the same arithmetic as ``layers.SandwichBlock`` written with few tensor ops per layer call
  (weights unpacked once, RoPE as one complex multiply over queries and keys together, the adapter's
  e-half computed once per token), because Python overhead per op dominates small models;
- hooked: the model's own ``prelude`` / ``core_step`` / ``coda`` with cache slots, chosen automatically
  whenever a hook function is attached so that interventions apply during generation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_cache import KVCache
from .layers import SandwichBlock
from .model import RecurrentLM

Packed = tuple[torch.Tensor, ...]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as in ``layers.RMSNorm``: float32 statistics, cast back, times the weight."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def _pack(block: SandwichBlock) -> Packed:
    a, m = block.attn, block.mlp
    n_heads, head_dim = a.n_heads, a.head_dim
    return (
        block.norm_1.weight,
        a.Wqkv.weight,
        a.qk_bias.reshape(2 * n_heads, head_dim),
        a.proj.weight,
        block.norm_2.weight,
        block.norm_3.weight,
        m.fc.weight,
        m.proj.weight,
        block.norm_4.weight,
    )


class CachedForward:
    """Embedding, prelude, core iterations and coda of ``model`` reading and writing ``cache``.

    Call :meth:`begin` with the chunk's first position and length, then :meth:`prelude`,
    :meth:`inject`, :meth:`core_step` (as often as wanted) and :meth:`coda`.
    """

    def __init__(self, model: RecurrentLM, cache: KVCache, hooked: bool | None = None) -> None:
        cfg = model.config
        self.model = model
        self.cache = cache
        self.hooked = any(p.fns for p in model._hook_points.values()) if hooked is None else hooked
        self.h, self.n_heads, self.head_dim = cfg.n_embd, cfg.n_heads, cfg.head_dim
        self.eps = cfg.norm_eps
        t = model.transformer
        self.prelude_layers = [_pack(b) for b in t.prelude]
        self.core_layers = [_pack(b) for b in t.core_block]
        self.coda_layers = [_pack(b) for b in t.coda]
        n_prelude, n_coda = len(t.prelude), len(t.coda)
        self.prelude_slots = [cache.physical(i) for i in range(n_prelude)]
        self.core_slots = [
            [cache.core_slot(step, j) for j in range(len(t.core_block))]
            for step in range(1, cache.max_steps + 1)
        ]
        self.coda_slots = [cache.physical(k - n_coda) for k in range(n_coda)]
        self.adapter_state = t.adapter.weight[:, : self.h].t()
        self.adapter_e = t.adapter.weight[:, self.h :]
        self.wte = t.wte.weight
        self.head = model.lm_head.weight
        self.ln_f = t.ln_f.weight
        self.freqs = model.rope_at(0, cfg.block_size)  # complex64 (block_size, head_dim // 2)
        self._freqs = self.freqs[:1, None]
        self._rope = self.freqs[:1]

    def begin(self, start: int, length: int) -> None:
        """Set the positions the next chunk writes (checks the context length)."""
        self._rope = self.model.rope_at(start, length)
        self.cache.begin(start, length)
        self._freqs = self._rope[:, None]

    # Fast path ----------------------------------------------------------------------------------
    def _layer(self, x: torch.Tensor, p: Packed, slot: int) -> torch.Tensor:
        w1, wqkv, qk_bias, wo, w2, w3, wfc, wdown, w4 = p
        B, T, h = x.shape
        H, D, eps, c = self.n_heads, self.head_dim, self.eps, self.cache
        qkv = F.linear(_rms(x, w1, eps), wqkv)
        qk = (qkv[..., : 2 * h].view(B, T, 2 * H, D) + qk_bias).float()
        qk = torch.view_as_real(torch.view_as_complex(qk.unflatten(-1, (D // 2, 2))) * self._freqs)
        qk = qk.flatten(-2).type_as(x)
        kbuf, vbuf = c.k_slots[slot], c.v_slots[slot]
        kbuf[:, :, c.start : c.end] = qk[:, :, H:].transpose(1, 2)
        vbuf[:, :, c.start : c.end] = qkv[..., 2 * h :].view(B, T, H, D).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            qk[:, :, :H].transpose(1, 2),
            kbuf[:, :, : c.end],
            vbuf[:, :, : c.end],
            attn_mask=c.mask,
            is_causal=c.is_causal,
        )
        x = _rms(F.linear(y.transpose(1, 2).reshape(B, T, h), wo) + x, w2, eps)
        gate, up = F.linear(_rms(x, w3, eps), wfc).chunk(2, dim=-1)
        return _rms(F.linear(F.silu(gate) * up, wdown) + x, w4, eps)

    # The pieces ---------------------------------------------------------------------------------
    def prelude(self, input_ids: torch.Tensor) -> torch.Tensor:
        """e = Prelude(sqrt(h) · Embedding(ids)) for the chunk, (B, T, h)."""
        m = self.model
        if self.hooked:
            return m.prelude(m.embed(input_ids), self._rope, self.cache)
        x = F.embedding(input_ids, self.wte) * m.emb_scale
        for p, slot in zip(self.prelude_layers, self.prelude_slots):
            x = self._layer(x, p, slot)
        return x

    def inject(self, e: torch.Tensor) -> torch.Tensor:
        """What every core step needs from e (the adapter's e-half on the fast path)."""
        return e if self.hooked else F.linear(e, self.adapter_e)

    def start_state(self, state: torch.Tensor) -> torch.Tensor:
        """s_0 of the chunk (passes ``core.hook_state`` at step 0 on the hooked path)."""
        return self.model.hook_state(state, 0) if self.hooked else state

    def core_step(self, state: torch.Tensor, injected: torch.Tensor, step: int) -> torch.Tensor:
        """s_step from s_{step−1} (step 1-based, at most the cache's max_steps)."""
        if self.hooked:
            return self.model.core_step(state, injected, self._rope, step, self.cache)
        B, T, h = state.shape
        x = torch.addmm(injected.view(-1, h), state.reshape(-1, h), self.adapter_state).view(
            B, T, h
        )
        for p, slot in zip(self.core_layers, self.core_slots[step - 1]):
            x = self._layer(x, p, slot)
        return x

    def coda(
        self, state: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 logits, latents = ln_f(state)); logits of the last position only if asked."""
        if self.hooked:
            logits, latents = self.model.coda(state, self._rope, self.cache)
            return (logits[:, -1:] if last_only else logits), latents
        latents = _rms(state, self.ln_f, self.eps)
        x = latents
        for p, slot in zip(self.coda_layers, self.coda_slots):
            x = self._layer(x, p, slot)
        if last_only:
            x = x[:, -1:]
        return F.linear(_rms(x, self.ln_f, self.eps), self.head).float(), latents
