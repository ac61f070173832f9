"""The layer arithmetic of the recurrent-depth model as plain functions over tensors and weights.

One implementation of each piece, shared by everything that runs the model: the nn.Modules in
``layers.py`` and ``model.py``, the KV-cached path in ``cached_forward.py``, the compiled decode in
``compiled.py`` and the trajectory normalisation in ``workbench.trajectory``. Every eager caller computes
bit-identical float32 results because every caller runs exactly these ops; compiled graphs fuse them
(and, for one row on the CPU, write projections and attention as sums), so they agree to rounding.

Every layer is a "sandwich" block: ``x = norm_2(x + Attn(norm_1(x)))``, ``x = norm_4(x + MLP(norm_3(x)))``.
Attention uses a fused [Q; K; V] projection, a learned per-head bias on queries and keys added before
interleaved-pair RoPE, and torch's scaled_dot_product_attention.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

#: A hook on one activation: (tensor, step) -> tensor (the identity when nothing is attached).
ActivationHook = Callable[[torch.Tensor, "int | None"], torch.Tensor]


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 (a float64 map keeps its precision), float32 for every narrower type."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x²) + eps) in float32 (float64 stays float64), cast back to x's dtype, times
    ``weight``."""
    if x.dtype == torch.float32:  # torch's fused kernel computes exactly this formula
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.to(_at_least_float32(x.dtype))
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def rope_table(head_dim: int, length: int, base: float, device=None) -> torch.Tensor:
    """RoPE rotations as unit complex numbers (complex64), shape (length, head_dim // 2).

    Pair j of a head (dimensions 2j, 2j+1) at position p is rotated by p · base^(−2j/head_dim).
    """
    exponents = torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    positions = torch.arange(length, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq).float()
    return torch.complex(torch.cos(angles), torch.sin(angles))


def truncated_normal_state(
    like: torch.Tensor, std: float, scale: float, generator: torch.Generator | None
) -> torch.Tensor:
    """A random initial latent shaped like ``like``: TruncNormal(0, std², ±3·std) · ``scale``
    (no multiply where it is 1); zeros where ``std`` is not positive."""
    if std <= 0:
        return torch.zeros_like(like)
    state = torch.empty_like(like)  # every element is drawn below
    torch.nn.init.trunc_normal_(state, 0.0, std, -3 * std, 3 * std, generator=generator)
    return state * scale if scale != 1 else state


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` (B, T, ..., head_dim) by ``table`` (T, head_dim // 2).

    Each pair (a, b) is the complex number a + ib, multiplied by cos + i·sin in float32 (float64 for a
    float64 ``x``):
    (a, b) -> (a·cos − b·sin, b·cos + a·sin); cast back to x's dtype. ``table`` is complex, or real
    (T, head_dim // 2, 2) holding (cos, sin) (what compiled code passes: inductor fuses real
    arithmetic but not complex ops).
    """
    pairs = x.to(_at_least_float32(x.dtype)).unflatten(-1, (-1, 2))
    shape = (table.shape[0], *([1] * (x.dim() - 3)), table.shape[1])
    if table.is_complex() and not torch.compiler.is_compiling():
        if pairs.stride(-1) != 1:
            pairs = pairs.contiguous()
        rot = table.view(shape)
        return torch.view_as_real(torch.view_as_complex(pairs) * rot).flatten(-2).type_as(x)
    if table.is_complex():
        cos, sin = table.real.view(shape), table.imag.view(shape)
    else:
        cos, sin = table[..., 0].view(shape), table[..., 1].view(shape)
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return rotated.flatten(-2).type_as(x)


def _compiled_cpu_row(x: torch.Tensor, rows: int) -> bool:
    """True while torch.compile traces x for the CPU and ``rows`` is 1 (batch-1 decoding)."""
    return torch.compiler.is_compiling() and x.device.type == "cpu" and rows == 1


#: Weight-row groups a compiled one-row product reduces side by side (see :func:`linear`).
ROW_GROUPS = 4


def _groups(length: int) -> int:
    """How many equal groups of ``length`` outputs one loop reduces side by side: ``ROW_GROUPS``
    where they divide it, else one."""
    return ROW_GROUPS if length % ROW_GROUPS == 0 else 1


#: Weight shapes (out, in) whose compiled one-row products use torch's matrix-vector product.
MatvecShapes = Collection[tuple[int, int]]


def linear(x: torch.Tensor, weight: torch.Tensor, matvec: MatvecShapes = ()) -> torch.Tensor:
    """x @ weightᵀ. A single row inside a compiled graph on the CPU is a multiply-and-sum instead,
    unless the weight's shape is in ``matvec``.

    Written as a product and a sum over the input dimension, inductor emits one vectorised, parallel
    reduction per weight inside the token's single kernel; on many CPUs that streams the weight
    faster than torch's matrix-vector kernel, on others not, so the compiled decode measures both
    per shape (``compiled.CompileState.matvec_shapes``) and passes the shapes where torch's is faster.
    The weight's rows are split into ``ROW_GROUPS`` equal groups reduced by one loop: each row's sum
    is a chain of dependent vector adds, so one row at a time waits on the adder's latency, while
    four independent chains keep it busy (every row's own sum keeps its order, so the result is
    bit-identical). A row longer than ``CASCADE_LENGTH`` is summed in equal parts, and bf16 rows are
    widened by bit shifts (:func:`_row_sums`). x is materialised first (``as_strided`` makes inductor
    store it): otherwise the norm before the projection is recomputed once per weight row. Eager
    calls, GPUs and several rows keep F.linear.
    """
    rows = x.shape[:-1].numel()
    if _compiled_cpu_row(x, rows) and (weight.shape[0], weight.shape[1]) not in matvec:
        x = x.contiguous()
        x = x.as_strided(x.shape, x.stride()).unsqueeze(-2)
        return torch.cat(
            [_row_sums(x, rows) for rows in weight.chunk(_groups(weight.shape[0]))], -1
        )
    return F.linear(x, weight)


def _row_sums(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x · each row of ``rows`` as a multiply-and-sum for :func:`linear`, in x's dtype.

    A sum longer than ``CASCADE_LENGTH`` runs in equal parts with float32 partial sums. bf16 rows of
    even length are read as 32-bit pairs and widened by a shift (even elements) and a mask (odd
    ones): exact, and about half the vector instructions of inductor's bf16-to-float conversion,
    which otherwise bounds a product's speed below the memory bandwidth.
    """
    if x.dtype == torch.bfloat16 and x.shape[-1] % 2 == 0 and _pairs_readable(rows):
        (x_even, x_odd), (w_even, w_odd) = _bf16_halves(x), _bf16_halves(rows)
        products = x_even * w_even + x_odd * w_odd
    else:
        products = x * rows
    parts = _row_parts(products.shape[-1])
    if parts == 1:
        return products.sum(-1).to(x.dtype)
    partial = products.unflatten(-1, (parts, -1)).sum(-1, dtype=torch.float32)
    return partial.sum(-1).to(x.dtype)


def _pairs_readable(rows: torch.Tensor) -> bool:
    """True when ``rows`` can be read as 32-bit pairs in :func:`_bf16_halves`: unit stride along
    its (even) rows, on a little-endian machine (element 2j in the pair's low half). A row group of
    a contiguous weight starts at an even offset, which the trace cannot read."""
    return rows.stride(-1) == 1 and sys.byteorder == "little"


def _bf16_halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The even and the odd elements of bf16 ``t``'s last dimension as float32, exactly: a bf16 is
    the upper half of the float32 of equal value, and each 32-bit pair holds element 2j in its low
    half (little-endian)."""
    pairs = t.view(torch.int32)
    return (pairs << 16).view(torch.float32), (pairs & -65536).view(torch.float32)


#: Inductor's CPU code sums a float reduction longer than this through a pairwise-summation helper
#: that keeps its accumulators in memory, which streams a weight well below the read bandwidth;
#: :func:`linear` keeps each reduction at most this long.
CASCADE_LENGTH = 4096


def _row_parts(length: int) -> int:
    """The fewest equal parts, of a whole number of 16-element vectors, that cut a weight row of
    ``length`` into sums no longer than ``CASCADE_LENGTH`` (1 when none is needed or none fits)."""
    if length <= CASCADE_LENGTH:
        return 1
    for parts in range(-(-length // CASCADE_LENGTH), length // 16 + 1):
        if length % (16 * parts) == 0:
            return parts
    return 1


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(head_dim) + mask) v over (B, heads, T, head_dim); mask True = attend.

    One query per row inside a compiled CPU graph is written out (products, sums, softmax) so that
    inductor fuses it: a call of torch's fused attention there costs far more than its few thousand
    FLOPs. The weighted sum of values is split along head_dim into ``ROW_GROUPS`` groups reduced by
    one loop, for the reason :func:`linear` groups rows: inductor sums each vector of outputs over
    the keys as one chain of dependent adds, one vector after another, and four groups give the
    adder four independent chains (each output's sum keeps its order: the same bits).
    """
    if _compiled_cpu_row(q, q.shape[-2]) and not causal:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * q.shape[-1] ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(-1).unsqueeze(-1)
        parts = v.chunk(_groups(v.shape[-1]), -1)
        return torch.cat([(weights * part.unsqueeze(-3)).sum(-2) for part in parts], -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


class KVCacheSlot(Protocol):
    """What attention needs from a KV cache: store this call's keys/values, return what to attend to.

    ``update`` receives k and v as (B, heads, T_new, head_dim) and returns the keys and values to attend
    over plus an optional boolean attention mask (True = attend); a None mask means plain causal.
    """

    def update(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...


def attention(
    x: torch.Tensor,
    wqkv: torch.Tensor,
    qk_bias: torch.Tensor,
    wo: torch.Tensor,
    rope: torch.Tensor,
    cache: KVCacheSlot | None = None,
    matvec: MatvecShapes = (),
) -> torch.Tensor:
    """Causal self-attention of x (B, T, h); qk_bias (2, 1, heads, head_dim) sets the head layout."""
    B, T, h = x.shape
    n_heads, head_dim = qk_bias.shape[-2], qk_bias.shape[-1]
    qkv = linear(x, wqkv, matvec)
    # Queries and keys together: per-head bias, then RoPE (one op each); values untouched.
    qk = qkv[..., : 2 * h].view(B, T, 2, n_heads, head_dim)
    qk = apply_rope(qk + qk_bias.view(2, n_heads, head_dim), rope)
    q = qk[:, :, 0].transpose(1, 2)
    k = qk[:, :, 1].transpose(1, 2)
    v = qkv[..., 2 * h :].view(B, T, n_heads, head_dim).transpose(1, 2)
    if cache is None:
        y = attend(q, k, v, None, causal=True)
    else:
        k, v, mask = cache.update(k, v)
        # a branch rather than a value: under a dynamic-length compile T > 1 is symbolic, and
        # branching on it makes it a guard (true for every prompt chunk)
        causal = False
        if mask is None and T > 1:
            causal = True
        y = attend(q, k, v, mask, causal=causal)
    return linear(y.transpose(1, 2).reshape(B, T, h), wo, matvec)


def gated_mlp(
    x: torch.Tensor, w_fc: torch.Tensor, w_proj: torch.Tensor, matvec: MatvecShapes = ()
) -> torch.Tensor:
    """One fc projection to 2·I, split: SiLU(first half) · second half, then proj back to h."""
    gate, up = linear(x, w_fc, matvec).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, w_proj, matvec)


class BlockWeights(NamedTuple):
    """The tensors of one sandwich block (the nn.Module parameters themselves, not copies)."""

    norm_1: torch.Tensor
    wqkv: torch.Tensor
    qk_bias: torch.Tensor
    attn_proj: torch.Tensor
    norm_2: torch.Tensor
    norm_3: torch.Tensor
    mlp_fc: torch.Tensor
    mlp_proj: torch.Tensor
    norm_4: torch.Tensor


def attention_sublayer(
    x: torch.Tensor,
    w: BlockWeights,
    rope: torch.Tensor,
    eps: float,
    cache: KVCacheSlot | None = None,
    hooks: Sequence[ActivationHook] | None = None,
    step: int | None = None,
    matvec: MatvecShapes = (),
) -> torch.Tensor:
    """A block's first half: norm_2(x + Attn(norm_1(x))); ``hooks``: (attn_out, resid_mid)."""
    attn_out = attention(rms_norm(x, w.norm_1, eps), w.wqkv, w.qk_bias, w.attn_proj, rope, cache,
                         matvec)  # fmt: skip
    if hooks is None:
        return rms_norm(attn_out + x, w.norm_2, eps)
    attn_out = hooks[0](attn_out, step)
    return hooks[1](rms_norm(attn_out + x, w.norm_2, eps), step)


def mlp_sublayer(
    x: torch.Tensor,
    w: BlockWeights,
    eps: float,
    hooks: Sequence[ActivationHook] | None = None,
    step: int | None = None,
    matvec: MatvecShapes = (),
) -> torch.Tensor:
    """A block's second half: norm_4(x + MLP(norm_3(x))); ``hooks``: (mlp_out, resid_post)."""
    mlp_out = gated_mlp(rms_norm(x, w.norm_3, eps), w.mlp_fc, w.mlp_proj, matvec)
    if hooks is None:
        return rms_norm(mlp_out + x, w.norm_4, eps)
    mlp_out = hooks[0](mlp_out, step)
    return hooks[1](rms_norm(mlp_out + x, w.norm_4, eps), step)


def sandwich_block(
    x: torch.Tensor,
    w: BlockWeights,
    rope: torch.Tensor,
    eps: float,
    cache: KVCacheSlot | None = None,
    hooks: Sequence[ActivationHook] | None = None,
    step: int | None = None,
    matvec: MatvecShapes = (),
) -> torch.Tensor:
    """One decoder layer with a norm before and after each sub-layer: :func:`attention_sublayer`,
    then :func:`mlp_sublayer`.

    ``hooks`` (attn_out, resid_mid, mlp_out, resid_post) see and may replace those activations;
    ``step`` is passed to them (the core iteration, None outside the recurrence); ``matvec``: see
    :func:`linear`.
    """
    attn_hooks = hooks[:2] if hooks is not None else None
    mlp_hooks = hooks[2:] if hooks is not None else None
    x = attention_sublayer(x, w, rope, eps, cache, attn_hooks, step, matvec)
    return mlp_sublayer(x, w, eps, mlp_hooks, step, matvec)


def adapter(
    state: torch.Tensor, e: torch.Tensor, weight: torch.Tensor, matvec: MatvecShapes = ()
) -> torch.Tensor:
    """The core's input: Adapter(concat[s, e]), a (h, 2h) projection back to h."""
    return linear(torch.cat([state, e], dim=-1), weight, matvec)


def embed(input_ids: torch.Tensor, wte: torch.Tensor, scale: float) -> torch.Tensor:
    """sqrt(h) · Embedding(ids)."""
    return F.embedding(input_ids, wte) * scale


def lm_head(
    x: torch.Tensor, ln_f: torch.Tensor, wte: torch.Tensor, eps: float, matvec: MatvecShapes = ()
) -> torch.Tensor:
    """float32 logits of the coda's output: lm_head(ln_f(x)) with the tied embedding."""
    return linear(rms_norm(x, ln_f, eps), wte, matvec).float()
