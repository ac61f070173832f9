"""The pieces of a RecurrentLM forward pass run over a :class:`KVCache`, one chunk of positions at a time.

Two paths with the same arithmetic (both call :mod:`recurrent_model.functional`, so their results are
bit-identical):
- fast: the functional layers called directly on the weights, unpacked once, with no module or hook
  dispatch, because Python overhead per call dominates small models;
- hooked: the model's own ``prelude`` / ``core_step`` / ``coda`` with cache slots, chosen automatically
  whenever a hook function is attached so that interventions apply during generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import functional as fn
from .kv_cache import CacheSlot, KVCache

if TYPE_CHECKING:
    from .model import RecurrentLM


class CachedForward:
    """Embedding, prelude, core iterations and coda of ``model`` reading and writing ``cache``.

    Call :meth:`begin` with the chunk's first position and length, then :meth:`prelude`,
    :meth:`inject`, :meth:`core_step` (as often as wanted) and :meth:`coda`.
    """

    def __init__(self, model: RecurrentLM, cache: KVCache, hooked: bool | None = None) -> None:
        cfg = model.config
        self.model = model
        self.cache = cache
        self.hooked = model.has_hooks() if hooked is None else hooked
        self.h, self.eps = cfg.n_embd, cfg.norm_eps
        t = model.transformer
        n_coda = len(t.coda)
        self.prelude_layers = [(b.weights(), cache.slot(i)) for i, b in enumerate(t.prelude)]
        self._core_weights = [b.weights() for b in t.core_block]
        self._core_layers: dict[int, list[tuple[fn.BlockWeights, CacheSlot]]] = {}
        self.coda_layers = [(b.weights(), cache.slot(k - n_coda)) for k, b in enumerate(t.coda)]
        self.adapter = t.adapter.weight
        self.wte = t.wte.weight
        self.head = model.lm_head.weight
        self.ln_f = t.ln_f.weight
        self._rope = model.rope_at(0, 1)

    def begin(self, start: int, length: int) -> None:
        """Set the positions the next chunk writes (checks the context length)."""
        self._rope = self.model.rope_at(start, length)
        self.cache.begin(start, length)

    def core_layers(self, step: int) -> list[tuple[fn.BlockWeights, CacheSlot]]:
        """Weights and cache slot of every core layer at 1-based iteration ``step`` (built once)."""
        layers = self._core_layers.get(step)
        if layers is None:
            c = self.cache
            slots = [c.slot(c.n_prelude + c.n_core * (step - 1) + j) for j in range(c.n_core)]
            layers = self._core_layers[step] = list(zip(self._core_weights, slots))
        return layers

    def _layers(self, x: torch.Tensor, layers: list[tuple[fn.BlockWeights, CacheSlot]]):
        for weights, slot in layers:
            x = fn.sandwich_block(x, weights, self._rope, self.eps, slot)
        return x

    # The pieces ---------------------------------------------------------------------------------
    def prelude(self, input_ids: torch.Tensor) -> torch.Tensor:
        """e = Prelude(sqrt(h) · Embedding(ids)) for the chunk, (B, T, h)."""
        m = self.model
        if self.hooked:
            return m.prelude(m.embed(input_ids), self._rope, self.cache)
        return self._layers(fn.embed(input_ids, self.wte, m.emb_scale), self.prelude_layers)

    def inject(self, e: torch.Tensor) -> torch.Tensor:
        """What every core step needs from e (e itself: the adapter reads concat[s, e])."""
        return e

    def start_state(self, state: torch.Tensor) -> torch.Tensor:
        """s_0 of the chunk (passes ``core.hook_state`` at step 0 on the hooked path)."""
        return self.model.hook_state(state, 0) if self.hooked else state

    def core_step(self, state: torch.Tensor, injected: torch.Tensor, step: int) -> torch.Tensor:
        """s_step from s_{step−1} (step 1-based, at most the cache's max_steps)."""
        if self.hooked:
            return self.model.core_step(state, injected, self._rope, step, self.cache)
        x = fn.adapter(state, injected, self.adapter)
        return self._layers(x, self.core_layers(step))

    def coda(
        self, state: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 logits, latents = ln_f(state)); logits of the last position only if asked."""
        if self.hooked:
            logits, latents = self.model.coda(state, self._rope, self.cache)
            return (logits[:, -1:] if last_only else logits), latents
        latents = fn.rms_norm(state, self.ln_f, self.eps)
        x = self._layers(latents, self.coda_layers)
        if last_only:
            x = x[:, -1:]
        return fn.lm_head(x, self.ln_f, self.head, self.eps), latents
