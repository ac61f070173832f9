"""RecurrentLM: prelude → core block iterated r times on a latent state → coda, with hooks everywhere.

e   = Prelude( sqrt(h) · Embedding(x) )
s_0 = TruncNormal(0, σ², ±3σ) · sqrt(h) · init_scale,   σ² = 2/(5h)
s_i = Core( Adapter( concat[s_{i−1}, e] ) ),   i = 1 … r
p   = softmax( lm_head( ln_f( Coda( ln_f(s_r) ) ) ) )
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, overload

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from . import functional as fn
from .config import ContextLengthError, RecurrentConfig
from .depth import split_depth
from .diffusion import DiffusionOutput, generate_diffusion
from .generation import GenerationOutput, generate
from .hooks import ActivationCache, HookError, HookFn, HookPoint, name_matcher
from .layers import KVCacheSlot, RMSNorm, SandwichBlock, rope_table
from .saving import save_pretrained

__all__ = ["ContextLengthError", "LayerCache", "ModelOutput", "RecurrentLM", "Transformer"]


class LayerCache(Protocol):
    """A KV cache indexed per layer call (prelude i, core l_P + l_R·(step−1) + j, coda −(l_C − k))."""

    def slot(self, index: int) -> KVCacheSlot: ...


@dataclass
class ModelOutput:
    """What a forward pass returns.

    logits: (B, T, V) float32. latents: ln_f(s_r), (B, T, h). state: the raw last state s_r.
    loss: mean next-token cross-entropy when labels were given.
    """

    logits: torch.Tensor
    latents: torch.Tensor
    state: torch.Tensor
    num_steps: int
    loss: torch.Tensor | None = None


class Transformer(nn.Module):
    """The parameter container, laid out so that state_dict keys match the Huginn checkpoint."""

    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__()
        h = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, h)
        self.prelude = nn.ModuleList(
            SandwichBlock(config, f"prelude.{i}") for i in range(config.n_layers_in_prelude)
        )
        self.adapter = nn.Linear(2 * h, h, bias=False)
        self.core_block = nn.ModuleList(
            SandwichBlock(config, f"core.{j}", iterated=True)
            for j in range(config.n_layers_in_recurrent_block)
        )
        self.coda = nn.ModuleList(
            SandwichBlock(config, f"coda.{k}") for k in range(config.n_layers_in_coda)
        )
        self.ln_f = RMSNorm(h, config.norm_eps)


class RecurrentLM(nn.Module):
    """A recurrent-depth language model in the Huginn layout, with named hooks on every state."""

    def __init__(self, config: RecurrentConfig, init_weights: bool = True) -> None:
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.emb_scale = math.sqrt(config.n_embd)
        self._rope: torch.Tensor | None = None  # built on first use, on the weights' device
        self.activation_checkpointing = False
        self.tokenizer: Any = None
        self.hook_embed = HookPoint("hook_embed")
        self.hook_e = HookPoint("hook_e")
        self.hook_state = HookPoint("core.hook_state", iterated=True)
        self.hook_adapter = HookPoint("core.hook_adapter", iterated=True)
        self.hook_latent = HookPoint("hook_latent")
        self.hook_final_norm = HookPoint("hook_final_norm")
        self.hook_logits = HookPoint("hook_logits")
        self._hook_points = self._collect_hook_points()
        if init_weights:
            self.reset_parameters()

    # Construction --------------------------------------------------------------------------------
    def _collect_hook_points(self) -> dict[str, HookPoint]:
        t = self.transformer
        points: list[HookPoint] = [self.hook_embed]
        for block in t.prelude:
            points += block.hook_points()
        points += [self.hook_e, self.hook_state, self.hook_adapter]
        for block in t.core_block:
            points += block.hook_points()
        points.append(self.hook_latent)
        for block in t.coda:
            points += block.hook_points()
        points += [self.hook_final_norm, self.hook_logits]
        return {p.name: p for p in points}

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Takase small init: trunc-normal σ² = 2/(5h) at ±3σ; output projections σ/sqrt(2l)."""
        std, out_std = self.config.init_std, self.config.out_proj_std
        for name, param in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                s = out_std
            elif name.endswith("qk_bias"):
                param.zero_()
                continue
            elif ".norm_" in name or "ln_f" in name:
                param.fill_(1.0)
                continue
            else:
                s = std
            nn.init.trunc_normal_(param, 0.0, s, -3 * s, 3 * s, generator=generator)

    def blocks(self) -> list[SandwichBlock]:
        """Every sandwich block: prelude, core, coda."""
        t = self.transformer
        return [*t.prelude, *t.core_block, *t.coda]

    def compile_blocks(self, **compile_kwargs: Any) -> RecurrentLM:
        """torch.compile each sandwich block, so norms, RoPE, SiLU and residual adds fuse.

        Opt-in: compilation takes tens of seconds, and fused float arithmetic may differ from the
        eager model in the last bits. Hooks keep working (attaching one recompiles).
        """
        for block in self.blocks():
            block.compile(**compile_kwargs)
        return self

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.wte.weight.dtype

    # Pieces of the forward pass (also used by the KV-cached generation) ---------------------------
    def rope_at(self, start: int, length: int) -> torch.Tensor:
        """RoPE cos/sin for positions start … start + length − 1."""
        end = start + length
        if end > self.config.block_size:
            raise ContextLengthError(
                f"sequence of {end} tokens exceeds the model's context of "
                f"{self.config.block_size} tokens (block_size)"
            )
        table = self._rope
        if table is None or table.device != self.device:
            cfg = self.config
            with torch.inference_mode(False):  # a cached table must also serve autograd later
                table = rope_table(cfg.head_dim, cfg.block_size, cfg.rope_base, self.device)
            self._rope = table
        return table[start:end]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hook_embed(fn.embed(input_ids, self.transformer.wte.weight, self.emb_scale))

    def prelude(
        self, x: torch.Tensor, rope: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        for i, block in enumerate(self.transformer.prelude):
            x = block(x, rope, None, cache.slot(i) if cache is not None else None)
        return self.hook_e(x)

    def initial_state(
        self,
        e: torch.Tensor,
        init_scale: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """s_0 ~ TruncNormal(0, (σ·init_scale)², ±3σ·init_scale) · sqrt(h); zeros when init_scale = 0."""
        std = self.config.init_std * float(init_scale)
        state = torch.zeros_like(e)
        if std > 0:
            nn.init.trunc_normal_(state, 0.0, std, -3 * std, 3 * std, generator=generator)
            state = state * self.emb_scale
        return state

    def core_step(
        self,
        state: torch.Tensor,
        e: torch.Tensor,
        rope: torch.Tensor,
        step: int,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """One iteration s_{step−1} -> s_step (step is 1-based)."""
        x = self.hook_adapter(fn.adapter(state, e, self.transformer.adapter.weight), step)
        n_core = len(self.transformer.core_block)
        base = self.config.n_layers_in_prelude + n_core * (step - 1)
        for j, block in enumerate(self.transformer.core_block):
            x = block(x, rope, step, cache.slot(base + j) if cache is not None else None)
        return self.hook_state(x, step)

    def coda(
        self, state: torch.Tensor, rope: torch.Tensor, cache: LayerCache | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ln_f(s_r) -> coda -> ln_f -> lm_head. Returns (float32 logits, latents = ln_f(s_r))."""
        latents = self.hook_latent(self.transformer.ln_f(state))
        x = latents
        n_coda = len(self.transformer.coda)
        for k, block in enumerate(self.transformer.coda):
            x = block(x, rope, None, cache.slot(k - n_coda) if cache is not None else None)
        x = self.hook_final_norm(self.transformer.ln_f(x))
        logits = self.hook_logits(self.lm_head(x).float())
        return logits, latents

    def iterate(
        self,
        state: torch.Tensor,
        e: torch.Tensor,
        rope: torch.Tensor,
        num_steps: int,
        backprop_depth: int | None = None,
    ) -> torch.Tensor:
        """Run the core num_steps times; only the last ``backprop_depth`` iterations carry gradient."""
        state = self.hook_state(state, 0)
        depth = split_depth(num_steps, backprop_depth)
        if depth.no_grad:
            with torch.no_grad():
                for step in range(1, depth.no_grad + 1):
                    state = self.core_step(state, e, rope, step)
        use_ckpt = self.activation_checkpointing and torch.is_grad_enabled() and self.training
        for step in range(depth.no_grad + 1, depth.total + 1):
            if use_ckpt:
                state = checkpoint(self.core_step, state, e, rope, step, use_reentrant=False)
            else:
                state = self.core_step(state, e, rope, step)
        return state

    # The forward pass ----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        num_steps: int | None = None,
        init_state: torch.Tensor | None = None,
        init_scale: float = 1.0,
        labels: torch.Tensor | None = None,
        backprop_depth: int | None = None,
        generator: torch.Generator | None = None,
    ) -> ModelOutput:
        """Logits and latents for ``input_ids`` (B, T) after ``num_steps`` core iterations.

        num_steps None = the config's mean recurrence. init_state (B, T, h) replaces the random s_0.
        backprop_depth k: in training mode only the last k iterations carry gradient (default: the
        config's mean_backprop_depth); in eval mode every iteration does unless k is given.
        """
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}"
            )
        num_steps = self.config.mean_recurrence if num_steps is None else int(num_steps)
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        if backprop_depth is None and self.training:
            backprop_depth = self.config.mean_backprop_depth
        T = input_ids.shape[1]
        rope = self.rope_at(0, T)
        e = self.prelude(self.embed(input_ids), rope)
        if init_state is None:
            state = self.initial_state(e, init_scale, generator)
        else:
            if init_state.shape != e.shape:
                raise ValueError(
                    f"init_state has shape {tuple(init_state.shape)}, expected {tuple(e.shape)}"
                )
            state = init_state.to(device=e.device, dtype=e.dtype)
        state = self.iterate(state, e, rope, num_steps, backprop_depth)
        logits, latents = self.coda(state, rope)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.flatten(0, 1), labels.flatten().to(logits.device), ignore_index=-100
            )
        return ModelOutput(logits, latents, state, num_steps, loss)

    # Hooks ---------------------------------------------------------------------------------------
    def hook_names(self) -> list[str]:
        """Every hook name, in the order the hooks fire within one iteration of the forward pass."""
        return list(self._hook_points)

    def has_hooks(self) -> bool:
        """True while any hook function is attached (generation then runs the hooked path)."""
        return any(p.fns for p in self._hook_points.values())

    def hook_point(self, name: str) -> HookPoint:
        try:
            return self._hook_points[name]
        except KeyError:
            raise HookError(
                f"no hook named {name!r}; model.hook_names() lists the {len(self._hook_points)} "
                "available ones"
            ) from None

    def _resolve(self, name_or_predicate: str | Callable[[str], bool]) -> list[HookPoint]:
        if isinstance(name_or_predicate, str):
            return [self.hook_point(name_or_predicate)]
        if callable(name_or_predicate):
            return [p for n, p in self._hook_points.items() if name_or_predicate(n)]
        raise HookError(f"a hook is named by a string or a predicate, got {name_or_predicate!r}")

    @contextmanager
    def hooks(
        self, fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = ()
    ) -> Iterator[RecurrentLM]:
        """Attach ``fn(tensor, hook)`` to hook points for the duration of a ``with`` block.

        A function may return a tensor that replaces the activation (patching, steering, ablation).
        Hooks are removed on exit, also when the block raises.
        """
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name_or_predicate, fn in fwd_hooks:
                for point in self._resolve(name_or_predicate):
                    point.fns.append(fn)
                    added.append((point, fn))
            yield self
        finally:
            for point, fn in reversed(added):
                point.fns.remove(fn)

    def reset_hooks(self) -> None:
        """Remove every attached hook function."""
        for point in self._hook_points.values():
            point.fns.clear()

    def run_with_cache(
        self,
        input_ids: torch.Tensor,
        num_steps: int | None = None,
        init_state: torch.Tensor | None = None,
        names_filter: Any = None,
        cache_device: torch.device | str | None = None,
        cache_dtype: torch.dtype | None = None,
        **forward_kwargs: Any,
    ) -> tuple[ModelOutput, ActivationCache]:
        """Forward pass that records the activations of every hook accepted by ``names_filter``.

        Per-iteration hooks are stacked: ``cache["core.hook_state"]`` is (num_steps + 1, B, T, h) with
        s_0 … s_r. ``cache_device`` (e.g. "cpu") and ``cache_dtype`` (e.g. torch.float16) shrink
        recordings of big runs.
        """
        steps = self.config.mean_recurrence if num_steps is None else int(num_steps)
        wanted = name_matcher(names_filter)
        cache = ActivationCache()

        def store(x: torch.Tensor, point: HookPoint, step: int | None) -> None:
            x = x.detach()
            if not point.iterated:
                cache[point.name] = x.to(
                    device=cache_device or x.device, dtype=cache_dtype or x.dtype
                )
                return
            is_state = point is self.hook_state
            if point.name not in cache:
                n = steps + 1 if is_state else steps
                cache[point.name] = torch.empty(
                    (n, *x.shape), device=cache_device or x.device, dtype=cache_dtype or x.dtype
                )
            cache[point.name][step if is_state else step - 1].copy_(x)

        recorders = [
            (name, lambda x, hook, p=point: store(x, p, hook.step))
            for name, point in self._hook_points.items()
            if wanted(name)
        ]
        with self.hooks(recorders):
            output = self.forward(
                input_ids, num_steps=steps, init_state=init_state, **forward_kwargs
            )
        return output, cache

    # Generation ----------------------------------------------------------------------------------
    @overload
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        num_steps: int | None = None,
        *,
        return_details: Literal[False] = False,
        **options: Any,
    ) -> torch.Tensor: ...

    @overload
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        num_steps: int | None = None,
        *,
        return_details: Literal[True],
        **options: Any,
    ) -> GenerationOutput: ...

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        num_steps: int | None = None,
        *,
        return_details: bool = False,
        **options: Any,
    ) -> torch.Tensor | GenerationOutput:
        """Autoregressive generation with the KV cache and the paper's inference features.

        The sequences (B, T + new), or a :class:`GenerationOutput` with ``return_details=True``.
        Options: ``config=GenerationConfig(...)`` and/or its fields as keywords (``do_sample``,
        ``exit_criterion``, ``cache_budget``, ``draft_steps``, ``compile``, ...), plus
        ``attention_mask``, ``generator`` and ``streamer``; see ``recurrent_model.generation.generate``.
        """
        return generate(
            self, input_ids, max_new_tokens, num_steps, return_details=return_details, **options
        )

    def generate_diffusion(
        self, input_ids: torch.Tensor, max_new_tokens: int, **options: Any
    ) -> torch.Tensor | DiffusionOutput:
        """Generation with the diffusion-forcing sampler (parallel decoding across depth).

        Batch size 1; ``return_details=True`` adds the analysis tablets. See
        ``recurrent_model.diffusion.generate_diffusion`` for every keyword argument.
        """
        return generate_diffusion(self, input_ids, max_new_tokens, **options)

    # Persistence ---------------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path, max_shard_bytes: int | None = None) -> None:
        """Write config.json, model.safetensors (or shards of at most ``max_shard_bytes`` + index)
        and tokenizer.json (if any) atomically to ``path``."""
        save_pretrained(self, path, max_shard_bytes)

    def num_parameters(self, part: str | None = None) -> int:
        """Parameter count (tied embedding once) of the model or one part: "wte" (the embedding),
        "prelude", "adapter", "core" (= "core_block", the recurrent block), "coda" or "ln_f"."""
        names = ("wte", "prelude", "adapter", "core_block", "coda", "ln_f")
        parts = {"core": "core_block", **{name: name for name in names}}
        if part is not None and part not in parts:
            raise ValueError(f"unknown part {part!r}; parts: {', '.join(parts)}")
        module = self if part is None else getattr(self.transformer, parts[part])
        seen: set[int] = set()
        total = 0
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total
