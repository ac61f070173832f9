"""The forward recipe, written once: embed → prelude → (adapter → core) × r → ln_f → coda → ln_f → head.

:func:`run` is the one driver of that recipe. Every way of running the model calls it: the module
forward (``RecurrentLM``), the KV-cached chunks of generation and of the diffusion sampler
(:class:`cached_forward.ChunkRunner`) and the compiled decode graphs (:mod:`compiled`). They differ
only in the policy they pass:

- ``slots``: the KV-cache slot of each layer call, by part (None: no cache, causal attention);
- ``hooks``: the model's hook points (None inside compiled graphs and on the fast cached path, where
  no hook function is attached);
- ``block``: how one layer runs (a module, a compiled block), ``no_grad_steps`` and ``checkpoint``
  (truncated backprop, activation checkpointing), ``on_step`` (a per-step callback, e.g. an early
  exit), ``first`` / ``last`` (the part of the recipe a compiled piece runs) and ``last_only``.

So their float32 results are bit-identical wherever they run the same ops (compiled graphs fuse them
and agree to rounding). Layer-call indices, which name cache slots, follow :func:`core_call_index`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from torch.utils.checkpoint import checkpoint as checkpointed

from . import functional as fn
from .functional import BlockWeights, KVCacheSlot

if TYPE_CHECKING:
    from .hooks import HookPoint
    from .model import RecurrentLM

Slots = Sequence[KVCacheSlot] | None
BlockHooks = tuple["HookPoint", "HookPoint", "HookPoint", "HookPoint"]
#: One sandwich block: (x, weights, rope, eps, slot, hooks, step) -> x, as functional.sandwich_block.
BlockFn = Callable[..., torch.Tensor]


class PartSlots(Protocol):
    """The slot of every layer call of a forward, by part (:class:`CacheSlots`, :class:`SlotList`)."""

    prelude: Sequence[Any]
    coda: Sequence[Any]

    def core(self, step: int) -> Sequence[Any]: ...


class LayerCache(Protocol):
    """A KV cache indexed per layer call (prelude i, core :func:`core_call_index`, coda −(l_C − k))."""

    def slot(self, index: int) -> KVCacheSlot: ...


def core_call_index(n_prelude: int, n_core: int, step: int, layer: int) -> int:
    """The layer-call index of core layer ``layer`` at 1-based iteration ``step``.

    Prelude layer i is call i, coda layer k is call k − l_C (negative), core layer j at iteration
    ``step`` is l_P + l_R·(step − 1) + j: the numbering of the reference implementation's cache.
    """
    return n_prelude + n_core * (step - 1) + layer


class LayerStack(NamedTuple):
    """Every tensor and constant of the forward recipe (the parameters themselves, not copies).

    A layer is its :class:`BlockWeights`: plain tensors, so that a compiled graph guards a tuple of
    tensors instead of walking the module tree on every call. ``of(model, modules=True)`` holds the
    block modules instead, run by :func:`run_module` (the module forward: what FSDP's per-block
    sharding and ``compile_blocks`` hook into).
    """

    wte: torch.Tensor
    prelude: tuple[Any, ...]
    adapter: torch.Tensor
    core: tuple[Any, ...]
    ln_f: torch.Tensor
    coda: tuple[Any, ...]
    head: torch.Tensor
    emb_scale: float
    eps: float
    matvec: fn.MatvecShapes = ()  # see functional.linear: compiled one-row products kept as matvecs

    @classmethod
    def of(cls, model: RecurrentLM, modules: bool = False) -> LayerStack:
        t = model.transformer
        if modules:
            blocks = tuple
        else:
            blocks = lambda layers: tuple(b.weights() for b in layers)  # noqa: E731
        return cls(
            t.wte.weight, blocks(t.prelude), t.adapter.weight, blocks(t.core_block),
            t.ln_f.weight, blocks(t.coda), model.lm_head.weight, model.emb_scale,
            model.config.norm_eps,
        )  # fmt: skip


class StackHooks(NamedTuple):
    """The model's hook points in recipe order; each block's four as (attn_out, resid_mid, mlp_out,
    resid_post)."""

    embed: HookPoint
    prelude: tuple[BlockHooks, ...]
    e: HookPoint
    adapter: HookPoint
    state: HookPoint
    core: tuple[BlockHooks, ...]
    latent: HookPoint
    coda: tuple[BlockHooks, ...]
    final_norm: HookPoint
    logits: HookPoint


def layers(
    x: torch.Tensor,
    blocks: Sequence[BlockWeights],
    rope: torch.Tensor,
    eps: float,
    slots: Slots = None,
    hooks: Sequence[BlockHooks] | None = None,
    step: int | None = None,
    block: BlockFn = fn.sandwich_block,
    matvec: fn.MatvecShapes = (),
) -> torch.Tensor:
    """Sandwich blocks in turn, each with its cache slot and hooks (where given).

    ``block`` runs one layer with :func:`functional.sandwich_block`'s arguments (the compiled prefill
    passes a compiled one)."""
    for j, weights in enumerate(blocks):
        slot = slots[j] if slots is not None else None
        block_hooks = hooks[j] if hooks is not None else None
        x = block(x, weights, rope, eps, slot, block_hooks, step, matvec)
    return x


def run_module(
    x: torch.Tensor,
    module: Any,
    rope: torch.Tensor,
    eps: float,
    slot: KVCacheSlot | None = None,
    hooks: BlockHooks | None = None,
    step: int | None = None,
    matvec: fn.MatvecShapes = (),
) -> torch.Tensor:
    """One layer as its module: ``SandwichBlock.forward``, which fires the block's own hooks."""
    return module(x, rope, step, slot)


def embed(w: LayerStack, input_ids: torch.Tensor, hooks: StackHooks | None = None) -> torch.Tensor:
    """sqrt(h) · Embedding(ids), (B, T, h)."""
    x = fn.embed(input_ids, w.wte, w.emb_scale)
    return x if hooks is None else hooks.embed(x)


def prelude(
    w: LayerStack,
    x: torch.Tensor,
    rope: torch.Tensor,
    slots: Slots = None,
    hooks: StackHooks | None = None,
    block: BlockFn = fn.sandwich_block,
) -> torch.Tensor:
    """e = Prelude(x) of the embedded tokens x, (B, T, h)."""
    if hooks is None:
        return layers(x, w.prelude, rope, w.eps, slots, block=block, matvec=w.matvec)
    x = layers(x, w.prelude, rope, w.eps, slots, hooks.prelude, block=block, matvec=w.matvec)
    return hooks.e(x)


def core_step(
    w: LayerStack,
    state: torch.Tensor,
    e: torch.Tensor,
    rope: torch.Tensor,
    step: int,
    slots: Slots = None,
    hooks: StackHooks | None = None,
    block: BlockFn = fn.sandwich_block,
) -> torch.Tensor:
    """One iteration s_{step−1} -> s_step = Core(Adapter(concat[s, e])) (step is 1-based)."""
    x = fn.adapter(state, e, w.adapter, w.matvec)
    if hooks is None:
        return layers(x, w.core, rope, w.eps, slots, block=block, matvec=w.matvec)
    x = hooks.adapter(x, step)
    x = layers(x, w.core, rope, w.eps, slots, hooks.core, step, block, w.matvec)
    return hooks.state(x, step)


def coda(
    w: LayerStack,
    state: torch.Tensor,
    rope: torch.Tensor,
    slots: Slots = None,
    hooks: StackHooks | None = None,
    last_only: bool = False,
    block: BlockFn = fn.sandwich_block,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ln_f(s_r) -> coda -> ln_f -> head: (float32 logits, latents = ln_f(s_r)).

    ``last_only`` keeps the last position's logits. Without hooks the head then runs on that position
    alone; with hooks it runs on every position (so hook functions see the whole chunk) and the
    logits are cut afterwards.
    """
    latents = fn.rms_norm(state, w.ln_f, w.eps)
    if hooks is None:
        x = layers(latents, w.coda, rope, w.eps, slots, block=block, matvec=w.matvec)
        if last_only:
            x = x[:, -1:]
        return fn.lm_head(x, w.ln_f, w.head, w.eps, w.matvec), latents
    latents = hooks.latent(latents)
    x = layers(latents, w.coda, rope, w.eps, slots, hooks.coda, block=block, matvec=w.matvec)
    x = hooks.final_norm(fn.rms_norm(x, w.ln_f, w.eps))
    logits = hooks.logits(fn.linear(x, w.head, w.matvec).float())
    return (logits[:, -1:] if last_only else logits), latents


class CacheSlots:
    """The cache slot of every layer call of a forward pass, by part: prelude, core per step, coda."""

    def __init__(self, cache: LayerCache, n_prelude: int, n_core: int, n_coda: int) -> None:
        self.cache, self.n_prelude, self.n_core = cache, n_prelude, n_core
        self.prelude = [cache.slot(i) for i in range(n_prelude)]
        self.coda = [cache.slot(k - n_coda) for k in range(n_coda)]
        self._core: dict[int, list[KVCacheSlot]] = {}

    def core(self, step: int) -> list[KVCacheSlot]:
        """The slots of the core layers at 1-based iteration ``step`` (looked up once per step)."""
        slots = self._core.get(step)
        if slots is None:
            P, C = self.n_prelude, self.n_core
            slots = [self.cache.slot(core_call_index(P, C, step, j)) for j in range(C)]
            self._core[step] = slots
        return slots


class SlotList:
    """Slots given part by part: the prelude's, the core's of each step in turn, the coda's."""

    def __init__(
        self, prelude: Sequence[Any], steps: Sequence[Sequence[Any]], coda: Sequence[Any]
    ) -> None:
        self.prelude, self.steps, self.coda = prelude, steps, coda

    def core(self, step: int) -> Sequence[Any]:
        """The slots of the core layers at 1-based iteration ``step``."""
        return self.steps[step - 1]


class StepOutcome(NamedTuple):
    """What an ``on_step`` callback decides: the state to continue from, and whether to stop."""

    state: torch.Tensor
    stop: bool = False


#: After core iteration ``step``: (step, s_step, s_{step−1}) -> None (go on with s_step) or a
#: :class:`StepOutcome`.
OnStep = Callable[[int, torch.Tensor, torch.Tensor], "StepOutcome | None"]


class Outcome(NamedTuple):
    """What :func:`run` returns. logits (float32) and latents = ln_f(state) are None without the
    coda (``last=False``); state is the last raw state, e the prelude's output."""

    logits: torch.Tensor | None
    latents: torch.Tensor | None
    state: torch.Tensor
    e: torch.Tensor


def run(
    w: LayerStack,
    x: torch.Tensor,
    rope: torch.Tensor,
    num_steps: int,
    initial: torch.Tensor | Callable[[torch.Tensor], torch.Tensor],
    *,
    slots: PartSlots | None = None,
    hooks: StackHooks | None = None,
    block: BlockFn = fn.sandwich_block,
    no_grad_steps: int = 0,
    checkpoint: bool = False,
    on_step: OnStep | None = None,
    first: bool = True,
    last: bool = True,
    last_only: bool = False,
) -> Outcome:
    """The forward recipe: embed → prelude → ``num_steps`` core iterations → coda and head.

    ``x`` is the token ids (B, T), or e when not ``first`` (the prelude ran elsewhere); ``initial``
    is s_0 or makes it from e. ``last=False`` stops before the coda. The first ``no_grad_steps``
    iterations run without gradient, the others under activation checkpointing if ``checkpoint``.
    ``on_step`` sees each iteration's state and may replace it or stop the loop.
    """
    prelude_slots, coda_slots = (None, None) if slots is None else (slots.prelude, slots.coda)
    e = prelude(w, embed(w, x, hooks), rope, prelude_slots, hooks, block) if first else x
    state = initial(e) if callable(initial) else initial
    if hooks is not None:
        state = hooks.state(state, 0)
    for step in range(1, num_steps + 1):
        step_slots = slots.core(step) if slots is not None else None
        args = (w, state, e, rope, step, step_slots, hooks, block)
        if step <= no_grad_steps:
            with torch.no_grad():
                new = core_step(*args)
        elif checkpoint:
            new = checkpointed(core_step, *args, use_reentrant=False)
        else:
            new = core_step(*args)
        decided = on_step(step, new, state) if on_step is not None else None
        state = new if decided is None else decided.state
        if decided is not None and decided.stop:
            break
    if not last:
        return Outcome(None, None, state, e)
    logits, latents = coda(w, state, rope, coda_slots, hooks, last_only, block)
    return Outcome(logits, latents, state, e)
