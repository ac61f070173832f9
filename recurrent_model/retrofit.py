"""RetrofitLM: a pretrained Llama cut into prelude, recurrent block and coda (McLeish et al. 2025,
"retrofitted recurrence"), in the layout the published conversion writes (model_type huginn_raven).

e   = Prelude( Embedding(x) · embed_scale )          embed_scale 1 for a converted Llama
s_0 = TruncNormal(0, σ², ±3σ) (· embed_scale if ≠ 1)    σ = init_values.std · init_scale
s_i = Core( Adapter( concat[s_{i−1}, e] ) ),   i = 1 … r   (raw: no norm between steps)
p   = softmax( lm_head( ln_f( Coda(s_r) ) ) )          no ln_f before the coda, unlike Huginn

Every layer is a pre-norm Llama block (``x += attn(norm_1(x))``, ``x += mlp(norm_2(x))``) with
rotate-half RoPE (``rope_theta``) and grouped-query attention; the arithmetic is
:mod:`recurrent_model.llama_layers`. The forward follows the published
``raven_modeling_minimal_llama.py`` (LoopedLMs/retrofitting-recurrence @3797dedd);
``tests/data/retrofit`` holds its outputs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import functional as fn
from . import hook_names
from .atomic_io import atomic_directory
from .checkpoint import (
    CheckpointError,
    TensorHeader,
    check_tensors,
    family_tokenizer,
    file_tensors,
    placement,
    read_headers,
    set_parameter,
    weight_files,
)
from .config import ConfigError, ContextLengthError
from .cost import CostLayout, ModelCost
from .depth import split_depth
from .hooked import HookedModel
from .hooks import HookPoint
from .llama_layers import RMSNorm, SlotCache, attention, rope_table, split_heads, swiglu
from .model import ModelOutput
from .saving import SINGLE_FILE, TIED_HEAD, TOKENIZER_FILE, write_shards, write_weights

__all__ = ["RetrofitConfig", "RetrofitLM", "claims", "load_family"]

FAMILY = "Retrofitted"
#: Fields without a default in the published config class that the forward cannot do without.
REQUIRED_FIELDS = (
    "n_embd",
    "n_heads",
    "n_layers_in_prelude",
    "n_layers_in_recurrent_block",
    "n_layers_in_coda",
    "intermediate_size",
    "vocab_size",
    "rope_theta",
)
#: The config.json fields the dataclass holds; every other field passes through ``extra``.
READ_FIELDS = frozenset(
    {*REQUIRED_FIELDS, "num_key_value_heads", "norm_eps", "max_position_embeddings"}
    | {"mean_recurrence", "mean_backprop_depth", "tie_embeddings", "torch_dtype", "name"}
)
#: Tensors an untrained conversion saved by Huginn's original code may carry and the retrofit
#: forward never reads: Huginn's sandwich norms 3 and 4 of each layer and its RoPE table.
LEFTOVER_NORMS = ("norm_3.weight", "norm_4.weight")
LEFTOVER_TABLE = "freqs_cis"


def claims(raw: dict[str, Any]) -> bool:
    """Whether a huginn_raven config.json is the retrofitted layout: ``qk_bias`` false, or a
    ``rope_theta`` field present. Huginn's own layout always has a qk bias (``qk_bias`` true or
    absent, its default) and names its RoPE base ``rope_base``."""
    return not raw.get("qk_bias", True) or "rope_theta" in raw


# Configuration -----------------------------------------------------------------------------------
@dataclass
class RetrofitConfig:
    """The fields of a converted model's config.json that the forward reads; others pass through."""

    n_embd: int
    n_heads: int
    num_key_value_heads: int
    n_layers_in_prelude: int
    n_layers_in_recurrent_block: int
    n_layers_in_coda: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    norm_eps: float = 1e-6
    block_size: int = 4096
    mean_recurrence: int = 32
    mean_backprop_depth: int = 8
    tie_embeddings: bool = True
    init_std: float = 0.0
    embed_scale: float = 1.0
    torch_dtype: str = "float32"
    name: str = "retrofitted-lm"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        positive = ("n_embd", "n_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
        for name in (*positive, "block_size", "n_layers_in_recurrent_block", "mean_recurrence"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("n_layers_in_prelude", "n_layers_in_coda", "mean_backprop_depth"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_embd % self.n_heads != 0:
            raise ConfigError(f"n_embd={self.n_embd} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.num_key_value_heads != 0:
            raise ConfigError(
                f"n_heads={self.n_heads} is not divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def n_layers(self) -> int:
        return self.n_layers_in_prelude + self.n_layers_in_recurrent_block + self.n_layers_in_coda

    @property
    def cost(self) -> ModelCost:
        """Parameters, FLOPs per token and decode bytes of this shape (recurrent_model/cost.py)."""
        return ModelCost(self)

    def cost_layout(self) -> CostLayout:
        """Huginn's arrangement (outer blocks once, core blocks and the adapter per step) with
        pre-norm Llama blocks: fused q/k/v with grouped keys and values, two norms per block."""
        h, inter, kv_dim = (
            self.n_embd,
            self.intermediate_size,
            self.num_key_value_heads * self.head_dim,
        )
        block = {"wqkv": (h + 2 * kv_dim, h), "attn_proj": (h, h), "mlp_fc": (2 * inter, h),
                 "mlp_proj": (h, inter)}  # fmt: skip
        outer = self.n_layers_in_prelude + self.n_layers_in_coda
        return CostLayout(h, self.vocab_size, block, 2 * h, outer, self.n_layers_in_recurrent_block,
                          (h, 2 * h), self.tie_embeddings, h, 2 * kv_dim)  # fmt: skip

    def shape_summary(self) -> str:
        return (
            f"({self.n_layers_in_prelude}, {self.n_layers_in_recurrent_block}, "
            f"{self.n_layers_in_coda}) h={self.n_embd} heads={self.n_heads}/"
            f"{self.num_key_value_heads} kv r̄={self.mean_recurrence}"
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RetrofitConfig:
        """Read a config.json mapping; ConfigError naming the field for anything missing or not
        implemented here. Defaults are those of the published config class."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config must be a JSON object, got {type(raw).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in raw]
        if missing:
            raise ConfigError(f"config.json is missing required field(s): {', '.join(missing)}")
        _refuse_unsupported(raw)
        h = _number(raw, "n_embd", int)
        init_values = raw.get("init_values", {})
        if not isinstance(init_values, dict):
            raise ConfigError(f"config.json has init_values={init_values!r}, not an object")
        return cls(
            n_embd=h,
            n_heads=_number(raw, "n_heads", int),
            num_key_value_heads=_number(raw, "num_key_value_heads", int, raw["n_heads"]),
            n_layers_in_prelude=_number(raw, "n_layers_in_prelude", int),
            n_layers_in_recurrent_block=_number(raw, "n_layers_in_recurrent_block", int),
            n_layers_in_coda=_number(raw, "n_layers_in_coda", int),
            intermediate_size=_number(raw, "intermediate_size", int),
            vocab_size=_number(raw, "vocab_size", int),
            rope_theta=_number(raw, "rope_theta", float),
            norm_eps=_number(raw, "norm_eps", float, 1e-6),
            block_size=_number(
                raw, "max_position_embeddings", int, _number(raw, "block_size", int, 4096)
            ),
            mean_recurrence=_number(raw, "mean_recurrence", int, 32),
            mean_backprop_depth=_number(raw, "mean_backprop_depth", int, 8),
            tie_embeddings=bool(raw.get("tie_embeddings", True)),
            init_std=_number(init_values, "std", float, math.sqrt(2.0 / (5.0 * h))),
            embed_scale=_number(init_values, "embed_scale", float, math.sqrt(h)),
            torch_dtype=str(raw.get("torch_dtype", "float32")),
            name=str(raw.get("name", cls.name)),
            extra={k: v for k, v in raw.items() if k not in READ_FIELDS},
        )

    def to_dict(self) -> dict[str, Any]:
        """The published config.json layout (fields we were given and do not read pass through)."""
        init_values = {**self.extra.get("init_values", {})}
        init_values.update(std=self.init_std, embed_scale=self.embed_scale)
        return {
            **self.extra,
            "model_type": "huginn_raven",
            "n_embd": self.n_embd,
            "n_heads": self.n_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "n_layers": self.n_layers,
            "n_layers_in_prelude": self.n_layers_in_prelude,
            "n_layers_in_recurrent_block": self.n_layers_in_recurrent_block,
            "n_layers_in_coda": self.n_layers_in_coda,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "padded_vocab_size": self.vocab_size,
            "norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.block_size,
            "mean_recurrence": self.mean_recurrence,
            "mean_backprop_depth": self.mean_backprop_depth,
            "tie_embeddings": self.tie_embeddings,
            "qk_bias": False,
            "bias": False,
            "init_values": init_values,
            "torch_dtype": self.torch_dtype,
            "name": self.name,
        }

    def to_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def replace(self, **changes: Any) -> RetrofitConfig:
        return dataclasses.replace(self, **changes)


def _number(raw: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """raw[key] (else ``default``) as ``kind``; ConfigError naming the field when it is not one."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config.json has {key}={value!r}, not a number")
    if kind is int and value != int(value):
        raise ConfigError(f"config.json has {key}={value!r}, not an integer")
    return kind(value)


def _refuse_unsupported(raw: dict[str, Any]) -> None:
    """ConfigError, one line naming the field, for a config selecting what the forward lacks."""
    h, heads = _number(raw, "n_embd", int), max(_number(raw, "n_heads", int), 1)
    refusals = {
        "bias": (bool(raw.get("bias", False)), "an adapter bias"),
        "qk_bias": (bool(raw.get("qk_bias", False)), "Huginn's per-head q/k bias"),
        "rope_scaling": (raw.get("rope_scaling") is not None, "scaled RoPE"),
        "test_time_noise": (bool(raw.get("test_time_noise", 0)), "noise injected per step"),
        "padded_vocab_size": (
            raw.get("padded_vocab_size", raw["vocab_size"]) != raw["vocab_size"],
            "an embedding padded beyond vocab_size",
        ),
        "head_dim": (
            h % heads == 0 and raw.get("head_dim", h // heads) != h // heads,
            "head_dim ≠ n_embd/n_heads",
        ),
        "num_attention_heads": (
            raw.get("num_attention_heads", heads) != heads,
            "num_attention_heads ≠ n_heads",
        ),
    }
    for key, (refused, what) in refusals.items():
        if refused:
            raise ConfigError(
                f"config.json has {key}={raw[key]!r} ({what}), which the retrofitted forward here "
                "does not implement"
            )
    parts = sum(_number(raw, k, int) for k in REQUIRED_FIELDS[2:5])
    if raw.get("n_layers", parts) != parts:
        raise ConfigError(
            f"config.json has n_layers={raw['n_layers']} but prelude + core + coda = {parts}"
        )


# Layers ------------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Fused q/k/v projection (rows: q, then k, then v), grouped-query causal attention, output
    projection; no bias."""

    def __init__(self, config: RetrofitConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv = config.n_heads, config.num_key_value_heads
        kv_width = self.n_kv * config.head_dim
        self.chunks = [config.n_embd, kv_width, kv_width]
        self.Wqkv = nn.Linear(config.n_embd, sum(self.chunks), bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, cache: tuple[SlotCache, int] | None = None
    ) -> torch.Tensor:
        q, k, v = self.Wqkv(x).split(self.chunks, dim=-1)
        q, k, v = split_heads(q, self.n_heads), split_heads(k, self.n_kv), split_heads(v, self.n_kv)
        return self.proj(attention(q, k, v, rope, cache=cache))


class GatedMLP(nn.Module):
    """``fc`` (2I × h): first half the SiLU gate, second half up; their product through ``proj``."""

    def __init__(self, config: RetrofitConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc.weight.split(self.intermediate)
        return self.proj(swiglu(x, gate, up))


class LlamaBlock(nn.Module):
    """A pre-norm Llama layer with hooks: attn_out, resid_mid (after the attention residual),
    mlp_out, resid_post (after the MLP residual)."""

    def __init__(self, config: RetrofitConfig, name: str, iterated: bool = False) -> None:
        super().__init__()
        self.norm_1 = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config)
        self.norm_2 = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = GatedMLP(config)
        hooks = [HookPoint(n, iterated) for n in hook_names.block(name)]
        self.hook_attn_out, self.hook_resid_mid, self.hook_mlp_out, self.hook_resid_post = hooks

    def hook_points(self) -> list[HookPoint]:
        return [self.hook_attn_out, self.hook_resid_mid, self.hook_mlp_out, self.hook_resid_post]

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        step: int | None = None,
        cache: tuple[SlotCache, int] | None = None,
    ) -> torch.Tensor:
        attn = self.hook_attn_out(self.attn(self.norm_1(x), rope, cache), step)
        x = self.hook_resid_mid(x + attn, step)
        mlp = self.hook_mlp_out(self.mlp(self.norm_2(x)), step)
        return self.hook_resid_post(x + mlp, step)


class Transformer(nn.Module):
    """The parameter container, laid out so that state_dict keys match the published checkpoint."""

    def __init__(self, config: RetrofitConfig) -> None:
        super().__init__()
        h = config.n_embd

        def stack(part: str, n: int, iterated: bool = False) -> nn.ModuleList:
            return nn.ModuleList(
                LlamaBlock(config, hook_names.layer(part, i), iterated) for i in range(n)
            )

        self.wte = nn.Embedding(config.vocab_size, h)
        self.prelude = stack(hook_names.PRELUDE, config.n_layers_in_prelude)
        self.adapter = nn.Linear(2 * h, h, bias=False)
        self.core_block = stack(hook_names.CORE, config.n_layers_in_recurrent_block, True)
        self.coda = stack(hook_names.CODA, config.n_layers_in_coda)
        self.ln_f = RMSNorm(h, config.norm_eps)


# The model ---------------------------------------------------------------------------------------
class RetrofitLM(HookedModel):
    """A retrofitted-recurrence model with named hooks on every state (see the module docstring).

    Built with PyTorch's default init; real weights come from :func:`load_family`."""

    family = FAMILY
    random_initial_state = True

    def __init__(self, config: RetrofitConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.tokenizer: Any = None
        self._rope: torch.Tensor | None = None
        self.hook_embed = HookPoint(hook_names.EMBED)
        self.hook_e = HookPoint(hook_names.E)
        self.hook_state = HookPoint(hook_names.STATE, iterated=True)
        self.hook_adapter = HookPoint(hook_names.ADAPTER, iterated=True)
        self.hook_latent = HookPoint(hook_names.LATENT)
        self.hook_final_norm = HookPoint(hook_names.FINAL_NORM)
        self.hook_logits = HookPoint(hook_names.LOGITS)
        self.set_hook_points(self._collect_hook_points())

    def _collect_hook_points(self) -> list[HookPoint]:
        t = self.transformer
        points = [self.hook_embed, *(p for b in t.prelude for p in b.hook_points())]
        points += [self.hook_e, self.hook_state, self.hook_adapter]
        points += [p for b in t.core_block for p in b.hook_points()]
        points += [self.hook_latent, *(p for b in t.coda for p in b.hook_points())]
        points += [self.hook_final_norm, self.hook_logits]
        c = self.config
        counts = (c.n_layers_in_prelude, c.n_layers_in_recurrent_block, c.n_layers_in_coda)
        hook_names.check_created([p.name for p in points], *counts)
        return points

    def default_steps(self) -> int:
        """The config's mean recurrence: the depth of a forward with ``num_steps=None``."""
        return self.config.mean_recurrence

    # Pieces of the forward pass ------------------------------------------------------------------
    def rope_at(self, start: int, length: int) -> torch.Tensor:
        """RoPE cos/sin (2, length, head_dim) for positions start … start + length − 1; the table
        grows on demand (rows do not depend on its length)."""
        end = start + length
        if end > self.config.block_size:
            raise ContextLengthError(
                f"sequence of {end} tokens exceeds the model's context of "
                f"{self.config.block_size} tokens (max_position_embeddings)"
            )
        table, cfg = self._rope, self.config
        if table is None or table.device != self.device or table.shape[1] < end:
            held = 0 if table is None else table.shape[1]
            size = min(cfg.block_size, max(end, 2 * held))
            with torch.inference_mode(False):  # a cached table must also serve autograd later
                table = rope_table(cfg.head_dim, size, cfg.rope_theta, self.device)
            self._rope = table
        return table[:, start:end]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding(ids), times ``init_values.embed_scale`` only where that is not 1."""
        x = self.transformer.wte(input_ids)
        if self.config.embed_scale != 1:
            x = x * self.config.embed_scale
        return self.hook_embed(x)

    def prelude(
        self, x: torch.Tensor, rope: torch.Tensor, cache: SlotCache | None = None
    ) -> torch.Tensor:
        """e = Prelude(x) of the embedded tokens; prelude layer i uses cache slot i."""
        for i, block in enumerate(self.transformer.prelude):
            x = block(x, rope, None, _slot(cache, i))
        return self.hook_e(x)

    def initial_state(
        self, e: torch.Tensor, init_scale: float = 1.0, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """s_0 ~ TruncNormal(0, σ², ±3σ), σ = init_values.std · init_scale (times embed_scale where
        that is not 1); zeros when init_scale is 0."""
        std = self.config.init_std * float(init_scale)
        return fn.truncated_normal_state(e, std, self.config.embed_scale, generator)

    def core_step(
        self,
        state: torch.Tensor,
        e: torch.Tensor,
        rope: torch.Tensor,
        step: int,
        cache: SlotCache | None = None,
    ) -> torch.Tensor:
        """One iteration s_{step−1} -> s_step (1-based); core layer j uses cache slot
        P + (step−1)·C + j."""
        x = self.hook_adapter(self.transformer.adapter(torch.cat([state, e], dim=-1)), step)
        c = self.config
        first = c.n_layers_in_prelude + (step - 1) * c.n_layers_in_recurrent_block
        for j, block in enumerate(self.transformer.core_block):
            x = block(x, rope, step, _slot(cache, first + j))
        return self.hook_state(x, step)

    def coda(
        self,
        state: torch.Tensor,
        rope: torch.Tensor,
        cache: SlotCache | None = None,
        num_steps: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw s_r -> coda -> ln_f -> lm_head: (float32 logits, latents = ln_f(s_r)). With a cache,
        ``num_steps`` (r) places coda layer k at slot P + r·C + k, after every core slot."""
        if cache is not None and num_steps is None:
            raise ValueError("coda with a cache needs num_steps, the r its slots follow")
        c = self.config
        first = c.n_layers_in_prelude + (num_steps or 0) * c.n_layers_in_recurrent_block
        x = self.hook_latent(state)
        latents = self.transformer.ln_f(x)
        for k, block in enumerate(self.transformer.coda):
            x = block(x, rope, None, _slot(cache, first + k))
        x = self.hook_final_norm(self.transformer.ln_f(x))
        return self.hook_logits(self.lm_head(x).float()), latents

    def state_norm(self) -> RMSNorm:
        """The norm the analyses view the states through: ln_f (z_i = ln_f(s_i))."""
        return self.transformer.ln_f

    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int, num_steps: int | None = None, **options
    ) -> Any:
        """Autoregressive generation at a fixed depth with a KV cache (a slot per layer call; a
        fresh random s_0 per token, as the forward draws it). Exit criteria are not offered for
        this family: its readout is the coda's layers, which a skipped loop would leave without
        cache entries. Options as :func:`recurrent_model.loop_generation.generate_every_loop`."""
        from .loop_generation import generate_every_loop

        if options.get("exit_criterion") is not None:
            raise ValueError(f"exit criteria are not offered for the {FAMILY} family: generate "
                             "runs every token at num_steps")  # fmt: skip
        return generate_every_loop(self, input_ids, max_new_tokens, num_steps, **options)

    # The forward pass ----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        num_steps: int | None = None,
        init_state: torch.Tensor | None = None,
        init_scale: float = 1.0,
        labels: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        backprop_depth: int | None = None,
        *,
        cache: SlotCache | None = None,
        start: int = 0,
    ) -> ModelOutput:
        """Logits and latents for ``input_ids`` (B, T) after ``num_steps`` core iterations (None:
        the config's mean recurrence). init_state (B, T, h) replaces the random s_0. backprop_depth
        k: in training mode only the last k iterations carry gradient (default: the config's
        mean_backprop_depth, as the published training truncates); in eval mode every iteration
        does unless k is given. ``cache`` holds every layer call's keys and values; ``start`` is
        the position of the first token."""
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}"
            )
        steps = _checked_steps(self.default_steps() if num_steps is None else num_steps)
        if backprop_depth is None and self.training:
            backprop_depth = self.config.mean_backprop_depth
        no_grad_steps = split_depth(steps, backprop_depth).no_grad
        rope = self.rope_at(start, input_ids.shape[1])
        if cache is not None:
            cache.begin(start)
        e = self.prelude(self.embed(input_ids), rope, cache)
        if init_state is None:
            state = self.initial_state(e, init_scale, generator)
        elif init_state.shape != e.shape:
            raise ValueError(
                f"init_state has shape {tuple(init_state.shape)}, expected {tuple(e.shape)}"
            )
        else:
            state = init_state.to(device=e.device, dtype=e.dtype)
        state = self.hook_state(state, 0)
        for step in range(1, steps + 1):
            with torch.set_grad_enabled(torch.is_grad_enabled() and step > no_grad_steps):
                state = self.core_step(state, e, rope, step, cache)
        logits, latents = self.coda(state, rope, cache, steps)
        loss = None
        if labels is not None:
            flat = logits.flatten(0, 1)
            loss = F.cross_entropy(flat, labels.flatten().to(flat.device), ignore_index=-100)
        return ModelOutput(logits, latents, state, steps, loss)

    # Persistence ---------------------------------------------------------------------------------
    def save_pretrained(self, path: str | os.PathLike, max_shard_bytes: int | None = None) -> None:
        """Write config.json, model.safetensors (or shards of at most ``max_shard_bytes`` + index)
        and tokenizer.json (if any) atomically, in the published layout (a tied head not stored)."""
        if max_shard_bytes is not None and max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
        tied = self.config.tie_embeddings
        tensors = {
            k: v.detach().to("cpu").contiguous()
            for k, v in self.state_dict().items()
            if not (tied and k == TIED_HEAD)
        }
        config = self.config.to_dict()
        dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
        if len(dtypes) == 1:
            config["torch_dtype"] = str(dtypes.pop()).removeprefix("torch.")
        with atomic_directory(path) as tmp:
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            if max_shard_bytes is None:
                write_weights(tensors, tmp / SINGLE_FILE)
            else:
                write_shards(tensors, tmp, max_shard_bytes)
            if self.tokenizer is not None:
                self.tokenizer.save(tmp / TOKENIZER_FILE)


def _slot(cache: SlotCache | None, slot: int) -> tuple[SlotCache, int] | None:
    return None if cache is None else (cache, slot)


def _checked_steps(num_steps: Any) -> int:
    """num_steps as an int >= 0; ValueError naming it otherwise."""
    try:
        steps = operator.index(num_steps)
    except TypeError:
        raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}") from None
    if steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {steps}")
    return steps


# Loading -----------------------------------------------------------------------------------------
def leftover_keys(config: RetrofitConfig) -> set[str]:
    """The stored names that are accepted and ignored: Huginn's ``norm_3``/``norm_4`` of each layer
    and ``freqs_cis`` (see :data:`LEFTOVER_NORMS`)."""
    parts = {
        "prelude": config.n_layers_in_prelude,
        "core_block": config.n_layers_in_recurrent_block,
        "coda": config.n_layers_in_coda,
    }
    names = {LEFTOVER_TABLE}
    for part, n in parts.items():
        names |= {f"transformer.{part}.{i}.{norm}" for i in range(n) for norm in LEFTOVER_NORMS}
    return names


def check_against_model(
    directory: Path, model: RetrofitLM, headers: dict[str, TensorHeader]
) -> None:
    """CheckpointError listing every missing, unexpected or misshapen tensor of ``headers``."""
    ignored = leftover_keys(model.config)
    found = {k: v for k, v in headers.items() if k not in ignored}
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    optional = frozenset({TIED_HEAD} if model.config.tie_embeddings else ())
    problems = check_tensors(expected, found, optional)
    if problems:
        raise CheckpointError(
            f"{directory} does not match its config ({model.config.shape_summary()}): "
            + "; ".join(problems)
        )


@torch.no_grad()
def assign_weights(
    model: RetrofitLM,
    directory: Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Give the meta-device ``model`` the stored tensors on ``device`` in ``dtype``; with tied
    embeddings a stored head must equal the embedding."""
    ignored = leftover_keys(model.config)
    tied = model.config.tie_embeddings
    head: torch.Tensor | None = None
    for key, stored in tensors:
        if key in ignored:
            continue
        tensor = stored.to(device=device, dtype=dtype)
        if tied and key == TIED_HEAD:
            head = tensor
            continue
        set_parameter(model, key, tensor)
    if tied:
        model.lm_head.weight = model.transformer.wte.weight
        if head is not None and not torch.equal(head, model.transformer.wte.weight):
            raise CheckpointError(
                f"{directory} stores an lm_head.weight that differs from transformer.wte.weight, "
                "but its config ties them (tie_embeddings=true)"
            )
    for p in model.parameters():
        p.requires_grad_(True)


def load_family(
    directory: Path,
    raw: dict,
    label: str | None,
    device: torch.device | str | None,
    dtype: torch.dtype | str | None,
    require_tokenizer: bool,
) -> RetrofitLM:
    """Load a retrofitted checkpoint directory (one safetensors file or index + shards), in eval
    mode.

    Built on the meta device; the tokenizer and every tensor name and shape (from the headers) are
    checked before any data is read. ``dtype`` None or "auto" keeps the stored dtype; ``device``
    defaults to the CPU. Leftover Huginn tensors (:func:`leftover_keys`) are ignored.
    """
    config = RetrofitConfig.from_dict(raw)
    if "name" not in raw:
        config.name = label or directory.resolve().name
    tokenizer = family_tokenizer(directory, raw, config.vocab_size, require_tokenizer)
    with torch.device("meta"):
        model = RetrofitLM(config)
    files = weight_files(directory)
    headers = read_headers(directory, files)
    check_against_model(directory, model, headers)
    device, target = placement(raw, headers, device, dtype)
    assign_weights(model, directory, file_tensors(directory, files), device, target)
    model.tokenizer = tokenizer
    return model.eval()
