"""The building blocks of the recurrent-depth model as nn.Modules: parameters and hooks.

The arithmetic lives in :mod:`recurrent_model.functional`; these modules hold the weights (with
state_dict keys in the Huginn layout) and the hook points, and call those functions.
"""

from __future__ import annotations

import torch
from torch import nn

from . import functional as fn
from . import hook_names
from .config import RecurrentConfig
from .functional import KVCacheSlot, apply_rope, rope_table
from .hooks import HookPoint

__all__ = [
    "Attention",
    "GatedMLP",
    "KVCacheSlot",
    "RMSNorm",
    "SandwichBlock",
    "apply_rope",
    "rope_table",
]


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) in float32, cast back to the input dtype, times a learned weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fn.rms_norm(x, self.weight, self.eps)


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
        return fn.attention(x, self.Wqkv.weight, self.qk_bias, self.proj.weight, rope, cache)


class GatedMLP(nn.Module):
    """One fc projection to 2·I, split: SiLU(first half) · second half, then proj back to h."""

    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fn.gated_mlp(x, self.fc.weight, self.proj.weight)


class SandwichBlock(nn.Module):
    """One decoder layer with a norm before and after each sub-layer, and hooks on its activations."""

    def __init__(self, config: RecurrentConfig, name: str, iterated: bool = False) -> None:
        """``name`` is the layer's prefix (:func:`hook_names.layer`); its hooks are named from it."""
        super().__init__()
        eps = config.norm_eps
        self.eps = eps
        self.norm_1 = RMSNorm(config.n_embd, eps)
        self.attn = Attention(config)
        self.norm_2 = RMSNorm(config.n_embd, eps)
        self.norm_3 = RMSNorm(config.n_embd, eps)
        self.mlp = GatedMLP(config)
        self.norm_4 = RMSNorm(config.n_embd, eps)
        hooks = [HookPoint(n, iterated) for n in hook_names.block(name)]
        self.hook_attn_out, self.hook_resid_mid, self.hook_mlp_out, self.hook_resid_post = hooks

    def hook_points(self) -> list[HookPoint]:
        return [self.hook_attn_out, self.hook_resid_mid, self.hook_mlp_out, self.hook_resid_post]

    def weights(self) -> fn.BlockWeights:
        """The block's parameters in the order :func:`functional.sandwich_block` takes them."""
        a, m = self.attn, self.mlp
        return fn.BlockWeights(
            self.norm_1.weight, a.Wqkv.weight, a.qk_bias, a.proj.weight, self.norm_2.weight,
            self.norm_3.weight, m.fc.weight, m.proj.weight, self.norm_4.weight,
        )  # fmt: skip

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        step: int | None = None,
        cache: KVCacheSlot | None = None,
    ) -> torch.Tensor:
        hooks = (self.hook_attn_out, self.hook_resid_mid, self.hook_mlp_out, self.hook_resid_post)
        return fn.sandwich_block(x, self.weights(), rope, self.eps, cache, hooks, step)
