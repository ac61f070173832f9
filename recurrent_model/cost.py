"""The model's cost from its shape: parameters, FLOPs per token and bytes per decoded token.

One place for the arithmetic the training plan, the trainer's MFU, the app's estimates and the
benches share. Reach it from a config as ``config.cost`` (a :class:`ModelCost`); each family's config
describes its layout for it (``config.cost_layout()``, a :class:`CostLayout`).

Counting conventions:

- a matmul with a weight of ``n`` entries costs 2 n FLOPs per token (multiply and add);
- a forward runs the outer blocks (prelude and coda) once, the adapter (2h → h, where the family has
  one) and the core block ``r`` times, and the head (h → V) at every position that needs logits
  (``head_tokens``);
- attention is causal: a query at position i attends to the ``context`` cached keys and the keys
  0 … i of its own chunk; QKᵀ and AV each cost 2 h FLOPs per (query, key) pair, so a layer over T
  new tokens costs 4 h (T·context + T (T + 1) / 2), an average attended length of (T + 1) / 2;
- training (the published recipe, no recompute counted): the forward at the sampled depth, and a
  backward of twice the forward of the parts that carry gradient: prelude, the last ``grad``
  iterations, coda and head;
- a decoded token reads every weight it multiplies (the core block and adapter ``r`` times) and the
  keys and values of every layer call over its context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import RecurrentConfig

Shape = tuple[int, int]


@dataclass(frozen=True)
class CostLayout:
    """A family's layout as the cost arithmetic reads it: one block's projections (out, in) and
    other parameters (norms, biases), how many blocks run once per forward (``outer_layers``) and
    how many per step (``core_layers``), the per-step injection (``adapter``, None without one),
    whether the head is the embedding, the remaining parameters (final norms, an exit gate) and the
    numbers a layer call caches per position (keys and values: 2 · kv heads · head size)."""

    width: int
    vocab: int
    block: dict[str, Shape]
    block_other: int
    outer_layers: int
    core_layers: int
    adapter: Shape | None
    tied_head: bool
    other: int
    kv_width: int


#: Bytes per element of the dtypes a model runs in, by name.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of ``dtype`` (a torch dtype or its name, "torch." prefix allowed)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


@dataclass(frozen=True)
class ModelCost:
    """Parameters, FLOPs and decode bytes of one model shape (see the module docstring)."""

    config: RecurrentConfig

    @property
    def layout(self) -> CostLayout:
        return self.config.cost_layout()

    # Shapes and parameters ---------------------------------------------------------------------
    def block_shapes(self) -> dict[str, Shape]:
        """(out, in) of each projection of one block, by the name used in the layers."""
        return dict(self.layout.block)

    def weight_shapes(self) -> dict[str, Shape]:
        """Every distinct (out, in) projection a token multiplies: the block's, the adapter (where
        there is one), the head (the shapes the compiled decode times,
        ``compiled.CompileState.matvec_shapes``)."""
        layout = self.layout
        adapter = {"adapter": layout.adapter} if layout.adapter else {}
        return {**layout.block, **adapter, "head": (layout.vocab, layout.width)}

    @property
    def block_matmul_params(self) -> int:
        """Weights one block multiplies by (Huginn's sandwich block: 4 h² + 3 h I)."""
        return sum(o * i for o, i in self.layout.block.values())

    @property
    def block_params(self) -> int:
        """All parameters of one block: its projections and the rest (norms, biases)."""
        return self.block_matmul_params + self.layout.block_other

    @property
    def adapter_params(self) -> int:
        adapter = self.layout.adapter
        return adapter[0] * adapter[1] if adapter else 0

    @property
    def head_params(self) -> int:
        """The head's weights (counted once in ``parameters`` when tied to the embedding)."""
        return self.layout.vocab * self.layout.width

    @property
    def outer_layers(self) -> int:
        """Blocks run once per forward (prelude and coda)."""
        return self.layout.outer_layers

    @property
    def parameters(self) -> int:
        """Every parameter, a tied embedding once (equals the model's ``num_parameters()``)."""
        layout = self.layout
        blocks = (layout.outer_layers + layout.core_layers) * self.block_params
        embedding = self.head_params * (1 if layout.tied_head else 2)
        return blocks + self.adapter_params + embedding + layout.other

    @property
    def core_parameters(self) -> int:
        """Parameters iterated per core step: the core blocks and the adapter."""
        return self.layout.core_layers * self.block_params + self.adapter_params

    def layer_calls(self, r: int) -> int:
        """Block calls of one forward at ``r`` iterations: l_P + l_C + r·l_R."""
        return self.outer_layers + r * self.layout.core_layers

    def unrolled_parameters(self, r: int) -> int:
        """Weights a token multiplies by at depth ``r`` (the core and adapter ``r`` times)."""
        iterated = self.layout.core_layers * self.block_matmul_params
        once = self.outer_layers * self.block_matmul_params + self.head_params
        return once + r * (iterated + self.adapter_params)

    # FLOPs -------------------------------------------------------------------------------------
    def layer_attention_flops(self, tokens: int, context: int = 0) -> float:
        """Causal QKᵀ and AV of one layer call: ``tokens`` new queries after ``context`` cached
        keys, 4 h FLOPs per (query, key) pair."""
        pairs = tokens * context + tokens * (tokens + 1) / 2
        return 4.0 * self.config.n_embd * pairs

    def attention_flops(self, tokens: int, r: int, context: int = 0) -> float:
        """Causal attention of every layer call of a forward at ``r`` iterations."""
        return self.layer_attention_flops(tokens, context) * self.layer_calls(r)

    def forward_flops(
        self, tokens: int, r: int, context: int = 0, head_tokens: int | None = None
    ) -> float:
        """One sequence's forward over ``tokens`` new tokens at ``r`` iterations: every matmul
        (the head at ``head_tokens`` positions, all by default) and causal attention."""
        if tokens < 1 or r < 0 or context < 0:
            raise ValueError(
                f"tokens >= 1, r >= 0, context >= 0 expected, got {tokens}, {r}, {context}"
            )
        head = tokens if head_tokens is None else head_tokens
        body = self.unrolled_parameters(r) - self.head_params
        matmuls = 2.0 * (tokens * body + head * self.head_params)
        return matmuls + self.attention_flops(tokens, r, context)

    def forward_flops_per_token(self, seq_len: int, r: int) -> float:
        """A forward's FLOPs per token over a ``seq_len``-token sequence at ``r`` iterations."""
        return self.forward_flops(seq_len, r) / seq_len

    def train_flops_per_token(self, seq_len: int, r: int, grad: int) -> float:
        """A training token at depth ``r`` whose last ``grad`` iterations carry gradient: the
        forward plus twice the forward of the prelude, those iterations, the coda and the head."""
        if not 0 <= grad <= r:
            raise ValueError(f"grad must lie in 0 … r = {r}, got {grad}")
        carried = self.forward_flops(seq_len, grad)
        return (self.forward_flops(seq_len, r) + 2.0 * carried) / seq_len

    # Decode bytes ------------------------------------------------------------------------------
    def decode_weight_bytes(self, r: int, dtype: object) -> float:
        """Weight bytes one decoded token reads at ``r`` iterations (the core ``r`` times)."""
        return float(self.unrolled_parameters(r) * dtype_bytes(dtype))

    def decode_cache_bytes(self, context: int, r: int, dtype: object) -> float:
        """Key/value bytes one decoded token reads (its ``context`` earlier positions) and writes
        (its own), every layer call."""
        per_position = self.layout.kv_width * dtype_bytes(dtype)
        return float(per_position * (context + 1) * self.layer_calls(r))

    def decode_bytes_per_token(self, context: int, r: int, dtype: object) -> float:
        """Bytes one decoded token moves at batch 1: its weights and its KV-cache traffic."""
        return self.decode_weight_bytes(r, dtype) + self.decode_cache_bytes(context, r, dtype)

    # Recorded states ---------------------------------------------------------------------------
    def trajectory_bytes(self, positions: int, r: int, dtype: object = "float32") -> float:
        """Bytes of s_0 … s_r kept for ``positions`` token positions (one copy)."""
        return float(positions * (r + 1) * self.config.n_embd * dtype_bytes(dtype))
