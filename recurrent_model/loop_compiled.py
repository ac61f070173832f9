"""Compiled decode tokens for Ouro: every (loop, layer) call of a token through one compiled graph.

A decode token of Ouro runs r loops of all its layers. Each layer call is one compiled graph (the
weights, the cache slot and the position are its inputs, so one graph serves every layer of every
loop; a sliding-window layer has a graph of its own), and each loop ends in a compiled graph of the
shared norm and the exit gate. Inductor fuses the norms, RoPE, SiLU, residual adds and the cache
write; on the CPU a batch-1 projection is whichever of the sum-written product and torch's
matrix-vector product is faster for its shape on this machine (measured once per shape and kept in
the model's :class:`compiled.CompileState`, as Huginn's compiled decode does).

Keys and values live in static storage, one slot per (loop, layer) of (B, kv_heads, max_length,
D) positions; a token writes its position and attends over every position up to its own (within
the window on a sliding layer) under a mask. The prompt runs eagerly (the same forward as the
uncompiled generation) and its keys and values are copied into the slots.

A compiled token has no hook points: generation refuses ``compile=True`` while hooks are attached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from . import functional as fn
from . import llama_layers as ll
from .compiled import _CompiledFunction, _own_copy, compile_state, cpu_options
from .functional import MatvecShapes


class LayerWeights(NamedTuple):
    """One Ouro decoder layer's tensors, detached, in the order its forward uses them."""

    input_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    input_norm_2: torch.Tensor
    post_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    post_norm_2: torch.Tensor


class Shape(NamedTuple):
    """What a layer graph is specialised on besides its tensors' shapes."""

    heads: int
    kv_heads: int
    eps: float
    window: int | None
    matvec: MatvecShapes


def layer_weights(layer: Any) -> LayerWeights:
    a, m = layer.self_attn, layer.mlp
    tensors = (layer.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight,
               a.o_proj.weight, layer.input_layernorm_2.weight, layer.post_attention_layernorm.weight,
               m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight,
               layer.post_attention_layernorm_2.weight)  # fmt: skip
    return LayerWeights(*(t.detach() for t in tensors))


def _layer_token(
    x: torch.Tensor,
    w: LayerWeights,
    keys: torch.Tensor,
    values: torch.Tensor,
    position: torch.Tensor,
    rope: torch.Tensor,
    shape: Shape,
) -> torch.Tensor:
    """One token per row (x: (B, 1, h)) through one sandwich-norm layer at ``position`` (1,),
    writing its key and value into ``keys``/``values`` (B, kv_heads, L, D) there."""
    mv, eps = shape.matvec, shape.eps
    n = ll.rms_norm(x, w.input_norm, eps)
    q = ll.split_heads(fn.linear(n, w.q, mv), shape.heads)
    k = ll.split_heads(fn.linear(n, w.k, mv), shape.kv_heads)
    v = ll.split_heads(fn.linear(n, w.v, mv), shape.kv_heads)
    row = rope.index_select(1, position)
    q, k = ll.apply_rope(q, row), ll.apply_rope(k, row)
    keys.index_copy_(2, position, k)
    values.index_copy_(2, position, v)
    at = torch.arange(keys.shape[2], device=x.device)
    mask = at <= position
    if shape.window is not None:
        mask &= at > position - shape.window
    group = shape.heads // shape.kv_heads
    y = F.scaled_dot_product_attention(
        q,
        keys.repeat_interleave(group, dim=1),
        values.repeat_interleave(group, dim=1),
        attn_mask=mask[None, None, None],
    )
    a = fn.linear(y.transpose(1, 2).reshape(x.shape[0], 1, -1), w.o, mv)
    x = x + ll.rms_norm(a, w.input_norm_2, eps)
    n = ll.rms_norm(x, w.post_norm, eps)
    m = fn.linear(F.silu(fn.linear(n, w.gate, mv)) * fn.linear(n, w.up, mv), w.down, mv)
    return x + ll.rms_norm(m, w.post_norm_2, eps)


def _loop_end(
    x: torch.Tensor, norm: torch.Tensor, gate_w: torch.Tensor, gate_b: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop's state norm(x) and its exit gate λ = sigmoid(gate(state)) (B, 1)."""
    state = ll.rms_norm(x, norm, eps)
    return state, torch.sigmoid(F.linear(state, gate_w, gate_b)[..., 0])


def _head(state: torch.Tensor, weight: torch.Tensor, matvec: MatvecShapes) -> torch.Tensor:
    return fn.linear(state, weight, matvec).float()


class LoopDecode:
    """Compiled decode tokens of an Ouro model over static (loop, layer) cache slots for ``batch``
    rows of up to ``max_length`` positions at ``num_steps`` loops."""

    def __init__(self, model: Any, batch: int, max_length: int, num_steps: int) -> None:
        cfg, stack = model.config, model.model
        self.model, self.num_steps, self.max_length = model, num_steps, max_length
        self.state = compile_state(model)
        cpu_row = batch == 1 and model.device.type == "cpu"
        matvec = self.state.matvec_shapes(cfg, model.dtype) if cpu_row else ()
        self.layers = [layer_weights(layer) for layer in stack.layers]
        self.shapes = [
            Shape(cfg.num_attention_heads, int(cfg.num_key_value_heads), cfg.rms_norm_eps,
                  layer.self_attn.window, matvec)
            for layer in stack.layers
        ]  # fmt: skip
        self.end = (stack.norm.weight.detach(), stack.early_exit_gate.weight.detach(),
                    stack.early_exit_gate.bias.detach())  # fmt: skip
        self.head = (model.lm_head.weight.detach(), matvec)
        n_slots = num_steps * cfg.num_hidden_layers
        shape = (n_slots, 2, batch, int(cfg.num_key_value_heads), max_length, cfg.head_dim)
        self.storage = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.rope = model.rope_at(0, max_length)  # float32 (2, L, D), cast in the graph as eagerly
        self.positions = torch.arange(max_length, device=model.device).split(1)
        self.compile_seconds = 0.0

    def fill(self, cache: ll.SlotCache) -> None:
        """Copy an eager prompt's keys and values (one entry per (loop, layer) slot) into the
        static slots."""
        for slot, (k, v) in cache.slots.items():
            self.storage[slot, 0, :, :, : k.shape[2]] = k
            self.storage[slot, 1, :, :, : v.shape[2]] = v

    def _compiled(self, name: str, target: Callable) -> Callable:
        key = ("loop-decode", name, self.model.device.type)
        held = self.state.functions.get(key)
        if held is None:
            options = cpu_options() if self.model.device.type == "cpu" else None
            call = torch.compile(_own_copy(target), dynamic=False, fullgraph=True, options=options)
            held = self.state.functions[key] = _CompiledFunction(call, None)
        return held.call

    def _timed(self, key: tuple, call: Callable, *args: Any) -> Any:
        out, seconds = self.state.first_call(key, call, *args)
        self.compile_seconds += seconds
        return out

    @torch.inference_mode()
    def token(
        self, ids: torch.Tensor, position: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One token per row (B, 1) at ``position``: every loop's state s_0 … s_r (each (B, 1, h))
        and exit gate λ_1 … λ_r (each (B, 1))."""
        if not 0 <= position < self.max_length:
            raise ValueError(f"position {position} lies outside the compiled decode's "
                             f"{self.max_length} cache positions")  # fmt: skip
        layer, end = self._compiled("layer", _layer_token), self._compiled("end", _loop_end)
        at = self.positions[position]
        x = self.model.model.embed_tokens(ids)
        states, gates = [x], []
        n = len(self.layers)
        base = (self.model.dtype, tuple(ids.shape), self.max_length)
        for step in range(self.num_steps):
            for j, (w, shape) in enumerate(zip(self.layers, self.shapes, strict=True)):
                kv = self.storage[step * n + j]
                x = self._timed((*base, "layer", shape), layer, x, w, kv[0], kv[1], at,
                                self.rope, shape)  # fmt: skip
            x, lam = self._timed((*base, "end"), end, x, *self.end, self.shapes[0].eps)
            states.append(x)
            gates.append(lam)
        return states, gates

    @torch.inference_mode()
    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """float32 logits (B, 1, V) of one loop's state."""
        head = self._compiled("head", _head)
        return self._timed((self.model.dtype, tuple(state.shape), "head"), head, state, *self.head)
