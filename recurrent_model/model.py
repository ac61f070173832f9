"""RecurrentLM: prelude → core block iterated r times on a latent state → coda, with hooks everywhere.

e   = Prelude( sqrt(h) · Embedding(x) )
s_0 = TruncNormal(0, σ², ±3σ) · sqrt(h) · init_scale,   σ² = 2/(5h)
s_i = Core( Adapter( concat[s_{i−1}, e] ) ),   i = 1 … r
p   = softmax( lm_head( ln_f( Coda( ln_f(s_r) ) ) ) )
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from . import functional as fn
from . import hook_names, stack
from .config import ContextLengthError, RecurrentConfig
from .depth import split_depth
from .diffusion import DiffusionOutput, generate_diffusion
from .generation import GenerationOutput, generate
from .hooked import HookedModel
from .hooks import HookPoint
from .inductor_isa import isa_options
from .layers import RMSNorm, SandwichBlock, rope_table
from .saving import save_pretrained
from .stack import CacheSlots, LayerCache, LayerStack, StackHooks, run_module

__all__ = ["ContextLengthError", "LayerCache", "ModelOutput", "RecurrentLM", "Transformer"]


@dataclass
class ModelOutput:
    """What a forward pass returns.

    logits: (B, T, V) float32. latents: the normalised last state (Huginn: ln_f(s_r)), (B, T, h).
    state: the raw last state s_r. loss: mean next-token cross-entropy when labels were given.
    exit_pdf: (B, T, r) the learned exit distribution over the loops of a family that has one
    (Ouro), None for the others.
    """

    logits: torch.Tensor
    latents: torch.Tensor
    state: torch.Tensor
    num_steps: int
    loss: torch.Tensor | None = None
    exit_pdf: torch.Tensor | None = None


class Transformer(nn.Module):
    """The parameter container, laid out so that state_dict keys match the Huginn checkpoint."""

    def __init__(self, config: RecurrentConfig) -> None:
        super().__init__()
        h = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, h)
        self.prelude = nn.ModuleList(
            SandwichBlock(config, hook_names.layer(hook_names.PRELUDE, i))
            for i in range(config.n_layers_in_prelude)
        )
        self.adapter = nn.Linear(2 * h, h, bias=False)
        self.core_block = nn.ModuleList(
            SandwichBlock(config, hook_names.layer(hook_names.CORE, j), iterated=True)
            for j in range(config.n_layers_in_recurrent_block)
        )
        self.coda = nn.ModuleList(
            SandwichBlock(config, hook_names.layer(hook_names.CODA, k))
            for k in range(config.n_layers_in_coda)
        )
        self.ln_f = RMSNorm(h, config.norm_eps)


class RecurrentLM(HookedModel):
    """A recurrent-depth language model in the Huginn layout, with named hooks on every state."""

    family = "Huginn"
    random_initial_state = True  # s_0 is drawn per run (seeds and init scales differ)

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
        self._compile_state: Any = None  # the compiled path's per-model state (compiled.py)
        self.hook_embed = HookPoint(hook_names.EMBED)
        self.hook_e = HookPoint(hook_names.E)
        self.hook_state = HookPoint(hook_names.STATE, iterated=True)
        self.hook_adapter = HookPoint(hook_names.ADAPTER, iterated=True)
        self.hook_latent = HookPoint(hook_names.LATENT)
        self.hook_final_norm = HookPoint(hook_names.FINAL_NORM)
        self.hook_logits = HookPoint(hook_names.LOGITS)
        self.set_hook_points(self._collect_hook_points())
        self.stack_hooks = self._stack_hooks()
        if init_weights:
            self.reset_parameters()

    # Construction --------------------------------------------------------------------------------
    def _collect_hook_points(self) -> list[HookPoint]:
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
        c = self.config  # the names created here must be the ones hook_names.py declares
        counts = (c.n_layers_in_prelude, c.n_layers_in_recurrent_block, c.n_layers_in_coda)
        hook_names.check_created([p.name for p in points], *counts)
        return points

    def _stack_hooks(self) -> StackHooks:
        t = self.transformer
        blocks = lambda layers: tuple(tuple(b.hook_points()) for b in layers)  # noqa: E731
        return StackHooks(
            self.hook_embed, blocks(t.prelude), self.hook_e, self.hook_adapter, self.hook_state,
            blocks(t.core_block), self.hook_latent, blocks(t.coda), self.hook_final_norm,
            self.hook_logits,
        )  # fmt: skip

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
        eager model in the last bits. Hooks keep working (attaching one recompiles). On the CPU
        inductor's options name the vector ISA picked here (:mod:`.inductor_isa`) unless given.
        """
        if self.device.type == "cpu" and compile_kwargs.get("backend", "inductor") == "inductor":
            options = compile_kwargs.get("options") or {}
            compile_kwargs = {**compile_kwargs, "options": {**isa_options(), **options}}
        for block in self.blocks():
            block.compile(**compile_kwargs)
        return self

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

    def layer_stack(self) -> LayerStack:
        """The forward recipe's layers as the block modules (see :class:`stack.LayerStack`)."""
        return LayerStack.of(self, modules=True)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return stack.embed(self.layer_stack(), input_ids, self.stack_hooks)

    def _slots(self, cache: LayerCache | None) -> CacheSlots | None:
        if cache is None:
            return None
        cfg = self.config
        n_prelude, n_core = cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block
        return CacheSlots(cache, n_prelude, n_core, cfg.n_layers_in_coda)

    def prelude(
        self, x: torch.Tensor, rope: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        """e = Prelude(x) of the embedded tokens (see :meth:`embed`)."""
        slots = self._slots(cache)
        prelude_slots = slots.prelude if slots is not None else None
        hooks = self.stack_hooks
        return stack.prelude(self.layer_stack(), x, rope, prelude_slots, hooks, run_module)

    def initial_state(
        self,
        e: torch.Tensor,
        init_scale: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """s_0 ~ TruncNormal(0, (σ·init_scale)², ±3σ·init_scale) · sqrt(h); zeros when init_scale = 0."""
        std = self.config.init_std * float(init_scale)
        return fn.truncated_normal_state(e, std, self.emb_scale, generator)

    def core_step(
        self,
        state: torch.Tensor,
        e: torch.Tensor,
        rope: torch.Tensor,
        step: int,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """One iteration s_{step−1} -> s_step (step is 1-based)."""
        slots = self._slots(cache)
        core_slots = slots.core(step) if slots is not None else None
        w, hooks = self.layer_stack(), self.stack_hooks
        return stack.core_step(w, state, e, rope, step, core_slots, hooks, run_module)

    def coda(
        self, state: torch.Tensor, rope: torch.Tensor, cache: LayerCache | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ln_f(s_r) -> coda -> ln_f -> lm_head. Returns (float32 logits, latents = ln_f(s_r))."""
        slots = self._slots(cache)
        coda_slots = slots.coda if slots is not None else None
        w, hooks = self.layer_stack(), self.stack_hooks
        return stack.coda(w, state, rope, coda_slots, hooks, block=run_module)

    def iterate(
        self,
        state: torch.Tensor,
        e: torch.Tensor,
        rope: torch.Tensor,
        num_steps: int,
        backprop_depth: int | None = None,
    ) -> torch.Tensor:
        """Run the core num_steps times; only the last ``backprop_depth`` iterations carry gradient."""
        return stack.run(
            self.layer_stack(), e, rope, num_steps, state, first=False, last=False,
            **self._depth_policy(num_steps, backprop_depth),
        ).state  # fmt: skip

    def _depth_policy(self, num_steps: int, backprop_depth: int | None) -> dict[str, Any]:
        """The module forward's policy for :func:`stack.run`: its hooks and modules, truncated
        backprop, and activation checkpointing while training with it switched on."""
        no_grad = split_depth(num_steps, backprop_depth).no_grad
        checkpoint = self.activation_checkpointing and torch.is_grad_enabled() and self.training
        return dict(
            hooks=self.stack_hooks, block=run_module, no_grad_steps=no_grad, checkpoint=checkpoint
        )

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
        rope = self.rope_at(0, input_ids.shape[1])

        def initial(e: torch.Tensor) -> torch.Tensor:
            if init_state is None:
                return self.initial_state(e, init_scale, generator)
            if init_state.shape != e.shape:
                raise ValueError(
                    f"init_state has shape {tuple(init_state.shape)}, expected {tuple(e.shape)}"
                )
            return init_state.to(device=e.device, dtype=e.dtype)

        policy = self._depth_policy(num_steps, backprop_depth)
        out = stack.run(self.layer_stack(), input_ids, rope, num_steps, initial, **policy)
        loss = None
        if labels is not None:
            logits = out.logits.flatten(0, 1)
            loss = F.cross_entropy(logits, labels.flatten().to(logits.device), ignore_index=-100)
        return ModelOutput(out.logits, out.latents, out.state, num_steps, loss)

    def state_norm(self) -> RMSNorm:
        """The norm the analyses view the states through: ln_f (z_i = ln_f(s_i))."""
        return self.transformer.ln_f

    # Hooks (the names, ``hooks`` and ``run_with_cache`` are HookedModel's) -------------------------
    def default_steps(self) -> int:
        """The config's mean recurrence r̄: the depth of a forward with ``num_steps=None``."""
        return self.config.mean_recurrence

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

    @overload
    def generate_diffusion(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        num_steps: int | None = None,
        *,
        return_details: Literal[False] = False,
        **options: Any,
    ) -> torch.Tensor: ...

    @overload
    def generate_diffusion(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        num_steps: int | None = None,
        *,
        return_details: Literal[True],
        **options: Any,
    ) -> DiffusionOutput: ...

    def generate_diffusion(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        num_steps: int | None = None,
        *,
        return_details: bool = False,
        **options: Any,
    ) -> torch.Tensor | DiffusionOutput:
        """Generation with the diffusion-forcing sampler (parallel decoding across depth).

        Batch size 1; ``return_details=True`` adds the analysis tablets. Options:
        ``config=DiffusionConfig(...)`` and/or its fields as keywords (``inner_recurrence``,
        ``headway``, ``freeze_strategy``, ...), plus ``generator`` and ``streamer``; num_steps
        defaults to 32, the published sampler's default. See
        ``recurrent_model.diffusion.generate_diffusion``.
        """
        if num_steps is not None:
            options["num_steps"] = num_steps
        return generate_diffusion(
            self, input_ids, max_new_tokens, return_details=return_details, **options
        )

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
