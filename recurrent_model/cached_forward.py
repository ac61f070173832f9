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
    """A layer's weights; the q/k bias becomes the bias of the fused [Q; K; V] projection and the
    output projections are transposed views for ``addmm`` (projection plus residual in one op)."""
    a, m = block.attn, block.mlp
    qkv_bias = torch.cat([a.qk_bias.flatten(), a.qk_bias.new_zeros(a.n_heads * a.head_dim)])
    return (
        block.norm_1.weight,
        a.Wqkv.weight,
        qkv_bias.to(a.Wqkv.weight.dtype),
        a.proj.weight.t(),
        block.norm_2.weight,
        block.norm_3.weight,
        m.fc.weight,
        m.proj.weight.t(),
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
        self._hshape = (cfg.n_embd,)
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
        self.fp32 = model.dtype == torch.float32
        # RoPE for [Q; K; V] heads at once: values are multiplied by exactly 1 + 0i
        self._ones = torch.ones(1, self.n_heads, self.head_dim // 2, dtype=torch.complex64,
                                device=model.device)  # fmt: skip
        self._rope = model.rope_at(0, 1)
        self._B, self._T = cache.kv.shape[1], 1
        self._freqs = self._ones

    def begin(self, start: int, length: int) -> None:
        """Set the positions the next chunk writes (checks the context length)."""
        self._rope = self.model.rope_at(start, length)
        self.cache.begin(start, length)
        self._T = length
        H, half = self.n_heads, self.head_dim // 2
        self._freqs = torch.cat(
            [self._rope[:, None].expand(length, 2 * H, half), self._ones.expand(length, H, half)],
            dim=1,
        )

    # Fast path ----------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fp32:
            return F.rms_norm(x, self._hshape, weight, self.eps)
        return _rms(x, weight, self.eps)

    def _layer(self, x: torch.Tensor, p: Packed, slot: int) -> torch.Tensor:
        """One sandwich block over the chunk's (B·T, h) rows, reading and writing cache ``slot``."""
        w1, wqkv, qkv_bias, wo_t, w2, w3, wfc, wdown_t, w4 = p
        B, T, h = self._B, self._T, self.h
        H, D, c = self.n_heads, self.head_dim, self.cache
        qkv = F.linear(self._norm(x, w1), wqkv, qkv_bias).view(B, T, 3 * H, D // 2, 2)
        if not self.fp32:
            qkv = qkv.float()
        qkv = torch.view_as_real(torch.view_as_complex(qkv) * self._freqs).view(B, T, 3 * H, D)
        if not self.fp32:
            qkv = qkv.to(x.dtype)
        c.kv_slots[slot][:, c.start : c.end] = qkv[:, :, H:]
        y = F.scaled_dot_product_attention(
            qkv.as_strided((B, H, T, D), (T * 3 * H * D, D, 3 * H * D, 1)),  # queries
            c.k_slots[slot][:, :, : c.end],
            c.v_slots[slot][:, :, : c.end],
            attn_mask=c.mask,
            is_causal=c.is_causal,
        )
        y = y.view(B * T, h) if T == 1 else y.transpose(1, 2).reshape(B * T, h)
        x = self._norm(torch.addmm(x, y, wo_t), w2)
        gate, up = F.linear(self._norm(x, w3), wfc).chunk(2, dim=-1)
        return self._norm(torch.addmm(x, F.silu(gate) * up, wdown_t), w4)

    # The pieces ---------------------------------------------------------------------------------
    def prelude(self, input_ids: torch.Tensor) -> torch.Tensor:
        """e = Prelude(sqrt(h) · Embedding(ids)) for the chunk, (B, T, h)."""
        m = self.model
        if self.hooked:
            return m.prelude(m.embed(input_ids), self._rope, self.cache)
        x = F.embedding(input_ids.reshape(-1), self.wte) * m.emb_scale
        for p, slot in zip(self.prelude_layers, self.prelude_slots):
            x = self._layer(x, p, slot)
        return x.view(self._B, self._T, self.h)

    def inject(self, e: torch.Tensor) -> torch.Tensor:
        """What every core step needs from e (the adapter's e-half on the fast path)."""
        return e if self.hooked else F.linear(e.reshape(-1, self.h), self.adapter_e)

    def start_state(self, state: torch.Tensor) -> torch.Tensor:
        """s_0 of the chunk (passes ``core.hook_state`` at step 0 on the hooked path)."""
        return self.model.hook_state(state, 0) if self.hooked else state

    def core_step(self, state: torch.Tensor, injected: torch.Tensor, step: int) -> torch.Tensor:
        """s_step from s_{step−1} (step 1-based, at most the cache's max_steps)."""
        if self.hooked:
            return self.model.core_step(state, injected, self._rope, step, self.cache)
        x = torch.addmm(injected, state.reshape(-1, self.h), self.adapter_state)
        for p, slot in zip(self.core_layers, self.core_slots[step - 1]):
            x = self._layer(x, p, slot)
        return x.view(self._B, self._T, self.h)

    def coda(
        self, state: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 logits, latents = ln_f(state)); logits of the last position only if asked."""
        if self.hooked:
            logits, latents = self.model.coda(state, self._rope, self.cache)
            return (logits[:, -1:] if last_only else logits), latents
        latents = self._norm(state, self.ln_f)
        x = latents.view(-1, self.h)
        for p, slot in zip(self.coda_layers, self.coda_slots):
            x = self._layer(x, p, slot)
        x = x.view(self._B, self._T, self.h)
        if last_only:
            x = x[:, -1:]
        return F.linear(self._norm(x, self.ln_f), self.head).float(), latents
