"""The core recurrence as a map F(s) = core(adapter([s; e])) over one prompt's states, for torch.func.

A :class:`CoreMap` holds what the prompt fixes (e, the RoPE rows, the adapter and core weights) and
evaluates F on a (T, h) state with the functions of ``recurrent_model.functional``, so its arithmetic is
the model's own. Two views serve the stability analyses:

- the full map ``F`` over all T·h numbers (every position perturbed);
- a token's block ``block(t, context)``: x (h,) -> F(context with row t replaced by x)[t], the other
  positions held where ``context`` puts them. Attention is causal, so only rows 0 … t are evaluated.

Attention runs through torch's math kernel inside a :class:`CoreMap`: the fused CPU kernel has no
forward-mode derivative, and JVPs are how every analysis reads the Jacobian (never as a matrix).

The same analyses accept a plain callable on (T, h) tensors (a stand-in map with known answers);
:class:`CallableMap` gives it the same interface.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import recurrent_model as rm
from recurrent_model import functional as fn
from recurrent_model import hook_names
from recurrent_model.hooked import HookedModel

#: A map on states: (T, h) tensor -> (T, h) tensor.
StateFn = Callable[[torch.Tensor], torch.Tensor]


@contextmanager
def differentiable_attention() -> Iterator[None]:
    """Attention through the math kernel, which forward-mode AD (torch.func.jvp) supports."""
    with sdpa_kernel(SDPBackend.MATH):
        yield


@dataclass(frozen=True)
class SubLayer:
    """One piece of an iteration for the stretch attribution: a name, the hook it ends at, the map."""

    name: str
    hook: str
    apply: StateFn


class StateMap:
    """What every stability analysis needs from a map: its shape, F, a token's block and s_0."""

    shape: tuple[int, int]
    dtype: torch.dtype
    #: True when rows meet only in torch's causal scaled_dot_product_attention (a model's map
    #: without hooks): every token's block image then comes from one JVP (token_block_jvp).
    causal_rows: bool = False

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def block(self, position: int, context: torch.Tensor) -> StateFn:
        """x (h,) -> F(context with row ``position`` = x)[position]."""
        self.check_position(position)
        self.check_state(context)
        position = position % self.shape[0]

        def token_map(x: torch.Tensor) -> torch.Tensor:
            rows = torch.cat([context[:position], x[None], context[position + 1 :]])
            return self(rows)[position]

        return token_map

    def check_position(self, position: int) -> None:
        T = self.shape[0]
        if not isinstance(position, int) or isinstance(position, bool):
            raise TypeError(f"position must be an int, got {type(position).__name__}")
        if not -T <= position < T:
            raise IndexError(f"position {position} is out of range for a prompt of {T} tokens")

    def check_state(self, state: torch.Tensor, what: str = "state") -> None:
        if tuple(state.shape) != self.shape:
            raise ValueError(f"{what} has shape {tuple(state.shape)}, expected {self.shape}")
        if not bool(torch.isfinite(state).all()):
            raise ValueError(f"{what} holds NaN or infinite values")


class CallableMap(StateMap):
    """A plain callable on (T, h) tensors as a :class:`StateMap` (stand-ins with known answers)."""

    def __init__(self, function: StateFn, shape: tuple[int, int], dtype: torch.dtype) -> None:
        self.function = function
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = dtype

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        return self.function(state)


class CoreMap(StateMap):
    """F(s) = core(adapter([s; e])) for one prompt; s and F(s) are (T, h)."""

    causal_rows = True

    def __init__(
        self,
        e: torch.Tensor,
        adapter_weight: torch.Tensor,
        blocks: Sequence[fn.BlockWeights],
        rope: torch.Tensor,
        eps: float,
    ) -> None:
        if e.dim() != 2:
            raise ValueError(f"e must be (T, h), got shape {tuple(e.shape)}")
        self.e = e.detach()
        self.adapter_weight = adapter_weight.detach()
        self.blocks = tuple(fn.BlockWeights(*(w.detach() for w in b)) for b in blocks)
        self.rope = rope
        self.eps = eps
        self.shape = (int(e.shape[0]), int(e.shape[1]))
        self.dtype = e.dtype

    @classmethod
    def from_model(
        cls, model: rm.RecurrentLM, input_ids: torch.Tensor | Sequence[int], row: int = 0
    ) -> CoreMap:
        """The core map of row ``row`` of ``input_ids`` (B, T) or of a flat list of token ids."""
        e, rope = prompt_injection(model, input_ids, row)
        t = model.transformer
        blocks = [b.weights() for b in t.core_block]
        return cls(e, t.adapter.weight, blocks, rope, model.config.norm_eps)

    def prefix(self, length: int) -> CoreMap:
        """The same map over the first ``length`` positions (what position length − 1 sees)."""
        out = object.__new__(CoreMap)
        out.__dict__.update(self.__dict__)
        out.e, out.rope = self.e[:length], self.rope[:length]
        out.shape = (int(length), self.shape[1])
        return out

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        x = state[None]
        with differentiable_attention():
            for sub in self.sublayers():
                x = sub.apply(x)
        return x[0]

    def block(self, position: int, context: torch.Tensor) -> StateFn:
        self.check_position(position)
        self.check_state(context, "context")
        position = position % self.shape[0]
        head = self.prefix(position + 1)
        before = context[:position]

        def token_map(x: torch.Tensor) -> torch.Tensor:
            return head(torch.cat([before, x[None]]))[position]

        return token_map

    def sublayers(self) -> list[SubLayer]:
        """adapter, then per core layer j its attention and its MLP, each with its norms (1, T, h)."""
        e = self.e[None]
        pieces = [
            SubLayer("adapter", hook_names.ADAPTER, lambda s: fn.adapter(s, e, self.adapter_weight))
        ]
        for j, w in enumerate(self.blocks):
            pieces.append(
                SubLayer(f"core.{j}.attn", hook_names.core(j, "hook_resid_mid"), self._attn(w))
            )
            pieces.append(
                SubLayer(f"core.{j}.mlp", hook_names.core(j, "hook_resid_post"), self._mlp(w))
            )
        return pieces

    def _attn(self, w: fn.BlockWeights) -> StateFn:
        return lambda x: fn.attention_sublayer(x, w, self.rope, self.eps)

    def _mlp(self, w: fn.BlockWeights) -> StateFn:
        return lambda x: fn.mlp_sublayer(x, w, self.eps)


class LoopMap(StateMap):
    """One loop of another family's model as a map on one prompt's (T, h) states, through the
    model's own modules: Ouro's F(s) = norm(layers(s)) (no injection), a retrofitted model's
    F(s) = core(adapter([s; e])) with pre-norm layers. ``e`` is what the prompt fixes (the prelude's
    output; Ouro's embedding, which the loop does not read)."""

    def __init__(self, model: HookedModel, e: torch.Tensor) -> None:
        if e.dim() != 2:
            raise ValueError(f"e must be (T, h), got shape {tuple(e.shape)}")
        self.model = model
        self.e = e.detach()
        self.rope = model.rope_at(0, e.shape[0])
        self.shape = (int(e.shape[0]), int(e.shape[1]))
        self.dtype = e.dtype

    @classmethod
    def from_model(cls, model: HookedModel, input_ids: torch.Tensor | Sequence[int], row: int = 0):
        """The loop map of row ``row`` of ``input_ids`` (B, T) or of a flat list of token ids."""
        return cls(model, prompt_injection(model, input_ids, row)[0])

    def prefix(self, length: int) -> LoopMap:
        """The same map over the first ``length`` positions (what position length − 1 sees)."""
        return LoopMap(self.model, self.e[:length])

    @property
    def causal_rows(self) -> bool:  # type: ignore[override]
        """Rows meet only in attention unless a hook (which may mix positions) is attached."""
        return not self.model.has_hooks()

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        # no_grad: the weights are constants of the map; JVPs are forward-mode and unaffected
        with differentiable_attention(), torch.no_grad():
            return self.model.core_step(state[None], self.e[None], self.rope, 1)[0]

    def block(self, position: int, context: torch.Tensor) -> StateFn:
        self.check_position(position)
        self.check_state(context, "context")
        position = position % self.shape[0]
        head, before = self.prefix(position + 1), context[:position]
        return lambda x: head(torch.cat([before, x[None]]))[position]


def prompt_injection(
    model: HookedModel, input_ids: torch.Tensor | Sequence[int], row: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e (T, h), RoPE rows) of row ``row`` of ``input_ids``: what the prompt fixes for its map."""
    ids = as_batch(input_ids)
    if not 0 <= row < ids.shape[0]:
        raise IndexError(f"row {row} is out of range for a batch of {ids.shape[0]}")
    rope = model.rope_at(0, ids.shape[1])
    with torch.no_grad():
        e = model.prelude(model.embed(ids[row : row + 1].to(model.device)), rope)[0]
    return e, rope


def as_batch(input_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Token ids as a (B, T) long tensor; a flat sequence is one row."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be (batch, tokens) with tokens >= 1, got {tuple(ids.shape)}"
        )
    return ids.long()


def model_maps(
    model: HookedModel, input_ids: torch.Tensor | Sequence[int]
) -> list[CoreMap | LoopMap]:
    """One map per row of ``input_ids``: a :class:`CoreMap` for Huginn's layout (its functional
    arithmetic), a :class:`LoopMap` for the other families."""
    ids = as_batch(input_ids)
    kind = CoreMap if isinstance(model, rm.RecurrentLM) else LoopMap
    return [kind.from_model(model, ids, row) for row in range(ids.shape[0])]


def initial_state(
    model: HookedModel, core: CoreMap | LoopMap, init_scale: float, seed: int
) -> torch.Tensor:
    """s_0 (T, h) as the model draws it for a batch of one with ``Generator().manual_seed(seed)``
    (for Ouro the embedding, whatever the seed)."""
    generator = torch.Generator().manual_seed(int(seed))
    return model.initial_state(core.e[None], init_scale, generator)[0].to(core.e.device)


@torch.no_grad()
def iterate(core: StateFn, state: torch.Tensor, num_steps: int) -> torch.Tensor:
    """s_0 … s_num_steps under ``core`` as one (num_steps + 1, T, h) tensor."""
    states = [state]
    for _ in range(int(num_steps)):
        states.append(core(states[-1]))
    return torch.stack(states)


@dataclass(frozen=True)
class Problem:
    """One row to analyse: its map, where iteration starts (s_0) and where the other positions sit."""

    map: StateMap
    start: torch.Tensor
    context: torch.Tensor


def as_state_map(function: StateFn, state: torch.Tensor) -> tuple[StateMap, bool]:
    """A plain callable and its example state as a (T, h) map; True when the state was one (h,) row."""
    if state.dim() == 1:
        return CallableMap(lambda s: function(s[0])[None], (1, state.shape[0]), state.dtype), True
    if state.dim() != 2:
        raise ValueError(f"a stand-in map's state must be (h,) or (T, h), got {tuple(state.shape)}")
    return CallableMap(function, tuple(state.shape), state.dtype), False


def problems(
    model: rm.RecurrentLM | StateFn,
    input_ids: torch.Tensor | Sequence[int] | None,
    state: torch.Tensor | None,
    num_steps: int | None,
    init_scale: float,
    seed: int = 0,
) -> tuple[list[Problem], bool]:
    """The rows to analyse, and whether a stand-in's state was a single (h,) vector.

    A model: one :class:`Problem` per prompt row; ``state`` (B, T, h) or (T, h) is both the start and
    the context, else the start is s_0 (``init_scale``, ``seed``) and the context s_num_steps
    (default: the config's mean recurrence). A plain callable needs ``state`` (its start and context).
    """
    if not isinstance(model, HookedModel):
        if not callable(model):
            raise TypeError(f"expected a model or a callable map, got {type(model).__name__}")
        if state is None:
            raise ValueError("a stand-in map needs `state`, the point to start from")
        state = torch.as_tensor(state)
        map_, flat = as_state_map(model, state)
        start = state[None] if flat else state
        map_.check_state(start)
        return [Problem(map_, start, start)], flat
    if input_ids is None:
        raise ValueError("input_ids is required with a model")
    maps = model_maps(model, input_ids)
    if state is not None:
        return [
            Problem(m, s, s) for m, s in zip(maps, model_rows(state, len(maps), maps[0]))
        ], False
    steps = model.config.mean_recurrence if num_steps is None else int(num_steps)
    if steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {steps}")
    out = []
    for m in maps:
        start = initial_state(model, m, init_scale, seed)
        out.append(Problem(m, start, iterate(m, start, steps)[-1]))
    return out, False


def model_rows(state: torch.Tensor, rows: int, map_: StateMap) -> list[torch.Tensor]:
    """A given state (B, T, h) or (T, h) as one checked (T, h) tensor per prompt row."""
    state = torch.as_tensor(state)
    if state.dim() == 2:
        state = state[None]
    if state.dim() != 3 or state.shape[0] != rows:
        raise ValueError(
            f"state has shape {tuple(state.shape)}, expected ({rows}, {map_.shape[0]}, {map_.shape[1]})"
        )
    out = [
        s.to(dtype=map_.dtype, device=map_.e.device if hasattr(map_, "e") else s.device)
        for s in state
    ]
    for s in out:
        map_.check_state(s)
    return out
