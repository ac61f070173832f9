"""Every token's block image from one JVP (own-row attention) equals one JVP per token, on each
family's map; a map whose rows meet outside attention is refused, and a hooked one is not taken."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_family_model

from workbench.core_map import CallableMap, initial_state, iterate, model_maps
from workbench.lyapunov import batched_jvp, token_stretches
from workbench.token_block_jvp import own_row_attention, token_block_images

T = 20  # longer than the tiny Ouro's sliding window (8)


def _map_and_state(model: torch.nn.Module):
    ids = torch.randint(0, 512, (T,), generator=torch.Generator().manual_seed(3)).tolist()
    (core,) = model_maps(model, ids)
    state = iterate(core, initial_state(model, core, 1.0, 0), 3)[-1]
    return core, state


def _unit_rows(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    vectors = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    return vectors / vectors.norm(dim=-1, keepdim=True)


def test_one_pass_images_equal_one_jvp_per_token(family_model):
    core, state = _map_and_state(family_model)
    assert core.causal_rows
    vectors = _unit_rows(core.shape, state.dtype)
    rows = torch.arange(T)
    tangents = torch.zeros(T, *core.shape, dtype=state.dtype)
    tangents[rows, rows] = vectors
    expected = batched_jvp(core, state, tangents)[rows, rows]
    images = token_block_images(core, state, vectors)
    torch.testing.assert_close(images, expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        row = core.block(T - 1, state)
        _, one = torch.func.jvp(row, (state[-1],), (vectors[-1],))
    torch.testing.assert_close(images[-1], one, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal, window, kv_heads", [(True, None, 4), (False, 5, 2)])
def test_own_row_attention_has_the_fused_kernels_values(causal, window, kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, 9, 8, generator=g) for _ in range(2))
    mask = None
    if window is not None:
        at = torch.arange(9)
        mask = (at[None] <= at[:, None]) & (at[None] > at[:, None] - window)
    kw = dict(attn_mask=mask, is_causal=causal, enable_gqa=kv_heads != 4)
    torch.testing.assert_close(
        own_row_attention(q, k, v, **kw), F.scaled_dot_product_attention(q, k, v, **kw)
    )
    with pytest.raises(ValueError, match="as many keys as queries"):
        own_row_attention(q, k[..., :4, :], v[..., :4, :], is_causal=True)


@pytest.mark.parametrize("direction", ["earlier into later", "later into earlier"])
def test_rows_meeting_outside_attention_are_refused(family_model, direction):
    core, state = _map_and_state(family_model)

    def mix(s: torch.Tensor) -> torch.Tensor:
        if direction == "earlier into later":
            return s.cumsum(0)
        return s.flip(0).cumsum(0).flip(0)

    mixed = CallableMap(lambda s: core(s) + 0.5 * mix(s), core.shape, core.dtype)
    mixed.causal_rows = True  # claims what it does not hold
    row = T - 1 if direction == "earlier into later" else 0
    with pytest.raises(ValueError, match=f"token {row}'s block image .* rows meet outside torch"):
        token_stretches(mixed, state, 2)
    mixed.causal_rows = False  # the per-token JVPs serve any map
    assert token_stretches(mixed, state, 2).shape == (2, T)


@pytest.mark.parametrize("family", ["ouro", "retrofit"])  # Huginn's map: functional, hook-free
def test_a_hooked_loop_map_takes_one_jvp_per_token(family):
    model = tiny_family_model(family)
    core, _ = _map_and_state(model)
    name = next(iter(model._hook_points))
    with model.hooks([(name, lambda x, hook: x)]):
        assert not core.causal_rows
    assert core.causal_rows
