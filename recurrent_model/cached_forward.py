"""The chunk runner: the forward recipe over a :class:`KVCache`, one chunk of positions at a time.

A chunk is ``begin`` (its positions) → :func:`stack.run` over the cache's slots. ``run`` / ``forward``
drive a whole chunk (``forward`` with a per-step callback, and optionally without the coda);
``prelude``, ``iterate`` and ``coda`` run parts of one (the diffusion sampler mixes its embeddings
between them). The model's hook points are passed whenever a hook function is attached (so that
interventions apply during generation) and not otherwise (no hook dispatch: Python overhead per
call dominates small models); both run the same ops, so their results are bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from . import stack
from .kv_cache import KVCache

if TYPE_CHECKING:
    from .model import RecurrentLM


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

    def iterate(self, state: torch.Tensor, e: torch.Tensor, steps: int) -> torch.Tensor:
        """s_steps from s_0 = ``state`` over the chunk's prelude output ``e``."""
        out = stack.run(self.weights, e, self._rope, steps, state, slots=self.slots,
                        hooks=self.hooks, first=False, last=False)  # fmt: skip
        return out.state

    def coda(
        self, state: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 logits, latents = ln_f(state)); logits of the last position only if asked."""
        return stack.coda(self.weights, state, self._rope, self.slots.coda, self.hooks, last_only)

    def forward(
        self,
        ids: torch.Tensor,
        start: int,
        steps: int,
        initial: Callable[[torch.Tensor], torch.Tensor],
        *,
        last_only: bool = True,
        last: bool = True,
        on_step: stack.OnStep | None = None,
    ) -> stack.Outcome:
        """One whole chunk: ``ids`` (B, T) at positions start…, s_0 = ``initial(e)``, up to
        ``steps`` iterations (``on_step`` may stop earlier), then the coda unless ``last=False``."""
        self.begin(start, ids.shape[1])
        return stack.run(
            self.weights, ids, self._rope, steps, initial, slots=self.slots, hooks=self.hooks,
            on_step=on_step, last=last, last_only=last_only,
        )  # fmt: skip

    def run(
        self,
        ids: torch.Tensor,
        start: int,
        steps: int,
        initial: Callable[[torch.Tensor], torch.Tensor],
        last_only: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One whole chunk (see :meth:`forward`): (float32 logits, latents)."""
        out = self.forward(ids, start, steps, initial, last_only=last_only)
        return out.logits, out.latents
