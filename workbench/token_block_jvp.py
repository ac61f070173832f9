"""Every token's block image J_tt·v_t of a model map in one JVP, instead of one JVP per token.

A token's block ∂F_t/∂s_t holds the other rows fixed. In a model map the rows meet only in causal
attention, so with a tangent on row t alone no row before t moves, and row t's image is J_tt·v_t.
Putting each row's own tangent on every row at once would mix them: row t's attention would also
carry the tangents of the keys and values of rows u < t. :class:`OwnRowAttention` removes exactly
those terms: under it, ``F.scaled_dot_product_attention`` passes a query's tangent through its own
query, key and value only (the other keys and values enter as constants). Every other op of a map is
row-wise, so one JVP of the full map under it gives every row's J_tt·v_t: the work of one JVP rather
than T of them.

The primal values are those of plain attention (the added terms are zeros); only tangents change.
:func:`token_block_images` checks the first and the last row, each against a JVP with that row's
tangent alone, and stops with one line when they differ, which a map whose rows meet some other way
would show (the last row takes what reaches it from earlier rows, the first what reaches it from
later ones).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.func import jvp
from torch.overrides import TorchFunctionMode

#: A checked row's image from the one-pass JVP may differ from its own JVP's by this much, relative
#: to its norm (rounding of a different order of sums), or by this many of the dtype's ulps.
CHECK_RTOL, CHECK_ULPS = 1e-4, 64


def own_row_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Self-attention (B, heads, T, D) whose tangent at query i flows only through q_i, k_i and
    v_i; the same primal values as ``F.scaled_dot_product_attention`` with these arguments."""
    if dropout_p != 0.0:
        raise ValueError("own-row attention is for analysis maps: dropout_p must be 0")
    T = q.shape[-2]
    if k.shape[-2] != T:
        raise ValueError(
            f"own-row attention needs as many keys as queries (no cache), got {k.shape[-2]} and {T}"
        )
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k_fixed, v_fixed = k.detach(), v.detach()
    own_score = (q * (k - k_fixed)).sum(-1) * scale  # zero; its tangent is q_i · dk_i
    scores = q @ k_fixed.transpose(-2, -1) * scale + torch.diag_embed(own_score)
    if is_causal:
        upper = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(upper, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = scores.softmax(-1)
    own_weight = weights.diagonal(dim1=-2, dim2=-1)[..., None]
    # the second term is zero; its tangent is p_ii · dv_i
    return weights @ v_fixed + own_weight * (v - v_fixed)


class OwnRowAttention(TorchFunctionMode):
    """Inside it, torch's scaled_dot_product_attention is :func:`own_row_attention`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            return own_row_attention(*args, **kwargs)
        return func(*args, **kwargs)


def token_block_images(
    map_: Callable[[torch.Tensor], torch.Tensor],
    state: torch.Tensor,
    vectors: torch.Tensor,
    check: bool = True,
) -> torch.Tensor:
    """(T, h): row t is J_tt·v_t, token t's block Jacobian at ``state`` (T, h) applied to row t
    of ``vectors``, from one JVP of ``map_`` under :class:`OwnRowAttention`. ``check`` compares
    the first and the last row with JVPs of their tangents alone (two JVPs more): a map whose rows
    meet outside torch's attention (positions mixed by hand, attention written out) stops with a
    ValueError."""
    mode = OwnRowAttention()
    with mode:
        images = jvp(map_, (state,), (vectors,))[1]
    if check:
        for row in sorted({0, state.shape[0] - 1}):
            check_row(map_, state, vectors, images, row, mode.calls)
    return images


def check_row(
    map_: Callable[[torch.Tensor], torch.Tensor],
    state: torch.Tensor,
    vectors: torch.Tensor,
    images: torch.Tensor,
    row: int,
    attention_calls: int,
) -> None:
    """Stop with one line unless ``images[row]`` is the JVP of that row's tangent alone."""
    alone = torch.zeros_like(vectors)
    alone[row] = vectors[row]
    expected = jvp(map_, (state,), (alone,))[1][row]
    gap = float((images[row] - expected).double().norm())
    scale = float(expected.double().norm())
    allowed = max(CHECK_RTOL, CHECK_ULPS * torch.finfo(state.dtype).eps) * scale
    if not gap <= allowed:
        raise ValueError(
            f"the one-pass token JVP puts token {row}'s block image {gap:.3g} from its own JVP "
            f"(norm {scale:.3g}; {attention_calls} attention calls seen): the map's rows meet "
            f"outside torch's scaled_dot_product_attention"
        )
