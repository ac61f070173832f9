"""The chunk runner: the forward recipe over a :class:`KVCache`, one chunk of positions at a time.

A chunk is ``begin`` (its positions) → ``prelude`` → ``iterate`` (s_0 … s_r, as many iterations as
wanted) → ``coda``; :meth:`ChunkRunner.run` does all four. Generation and the diffusion sampler drive
their chunks through it. The arithmetic is :mod:`recurrent_model.stack`'s, with the model's hook points
passed whenever a hook function is attached (so that interventions apply during generation) and
without them otherwise (no hook dispatch: Python overhead per call dominates small models); both
run the same ops, so their results are bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from . import stack
from .kv_cache import KVCache

if TYPE_CHECKING:
    from .model import RecurrentLM

#: Called after each core iteration with (state, step); a chunk's per-step bookkeeping.
StepCallback = Callable[[torch.Tensor, int], None]


class ChunkRunner:
    """Embedding, prelude, core iterations and coda of ``model`` reading and writing ``cache``.

    ``hooked`` (default: whether the model has hooks attached now) passes the model's hook points.
    """

    def __init__(self, model: RecurrentLM, cache: KVCache, hooked: bool | None = None) -> None:
        cfg = model.config
        self.model, self.cache = model, cache
        self.hooked = model.has_hooks() if hooked is None else hooked
        self.hooks = model.stack_hooks if self.hooked else None
        self.weights = stack.LayerStack.of(model)
        self.slots = stack.CacheSlots(
            cache, cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block, cfg.n_layers_in_coda
        )
        self._rope = model.rope_at(0, 1)

    def begin(self, start: int, length: int) -> None:
        """Set the positions the next chunk writes (checks the context length)."""
        self._rope = self.model.rope_at(start, length)
        self.cache.begin(start, length)

    def prelude(self, input_ids: torch.Tensor) -> torch.Tensor:
        """e = Prelude(sqrt(h) · Embedding(ids)) for the chunk, (B, T, h)."""
        w, hooks = self.weights, self.hooks
        x = stack.embed(w, input_ids, hooks)
        return stack.prelude(w, x, self._rope, self.slots.prelude, hooks)

    def start_state(self, state: torch.Tensor) -> torch.Tensor:
        """s_0 of the chunk (passes ``core.hook_state`` at step 0 when hooked)."""
        return self.hooks.state(state, 0) if self.hooks is not None else state

    def core_step(self, state: torch.Tensor, e: torch.Tensor, step: int) -> torch.Tensor:
        """s_step from s_{step−1} (step 1-based, at most the cache's max_steps)."""
        slots = self.slots.core(step)
        return stack.core_step(self.weights, state, e, self._rope, step, slots, self.hooks)

    def iterate(
        self,
        state: torch.Tensor,
        e: torch.Tensor,
        steps: int,
        after_step: StepCallback | None = None,
    ) -> torch.Tensor:
        """s_steps from s_0 = ``state``; ``after_step(s_i, i)`` after each iteration where given."""
        state = self.start_state(state)
        for i in range(1, steps + 1):
            state = self.core_step(state, e, i)
            if after_step is not None:
                after_step(state, i)
        return state

    def coda(
        self, state: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 logits, latents = ln_f(state)); logits of the last position only if asked."""
        return stack.coda(self.weights, state, self._rope, self.slots.coda, self.hooks, last_only)

    def run(
        self,
        ids: torch.Tensor,
        start: int,
        steps: int,
        initial: Callable[[torch.Tensor], torch.Tensor],
        last_only: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One whole chunk: ``ids`` (B, T) at positions start…, s_0 = ``initial(e)``, ``steps``
        iterations, then the coda: (logits, latents)."""
        self.begin(start, ids.shape[1])
        e = self.prelude(ids)
        state = self.iterate(initial(e), e, steps)
        return self.coda(state, last_only=last_only)
