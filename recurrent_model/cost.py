"""The model's cost from its shape: parameters, FLOPs per token and bytes per decoded token.

One place for the arithmetic the training plan, the trainer's MFU, the app's estimates and the
benches share. Reach it from a config as ``config.cost`` (a :class:`ModelCost`).

Counting conventions:

- a matmul with a weight of ``n`` entries costs 2 n FLOPs per token (multiply and add);
- a forward runs the prelude and coda once, the adapter (2h → h) and the core block ``r`` times, and
  the tied head (h → V) at every position that needs logits (``head_tokens``);
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

    # Shapes and parameters ---------------------------------------------------------------------
    def block_shapes(self) -> dict[str, tuple[int, int]]:
        """(out, in) of each projection of one sandwich block, by the name used in the layers."""
        h, inter = self.config.n_embd, self.config.intermediate_size
        return {"wqkv": (3 * h, h), "attn_proj": (h, h), "mlp_fc": (2 * inter, h),
                "mlp_proj": (h, inter)}  # fmt: skip

    def weight_shapes(self) -> dict[str, tuple[int, int]]:
        """Every distinct (out, in) projection a token multiplies: the block's, adapter, head (the
        shapes the compiled decode times, ``compiled.CompileState.matvec_shapes``)."""
        h = self.config.n_embd
        return {**self.block_shapes(), "adapter": (h, 2 * h), "head": (self.config.vocab_size, h)}

    @property
    def block_matmul_params(self) -> int:
        """Weights one sandwich block multiplies by: 4 h² + 3 h I."""
        return sum(o * i for o, i in self.block_shapes().values())

    @property
    def block_params(self) -> int:
        """All parameters of one sandwich block: its projections, q/k bias (2h), four norms (4h)."""
        return self.block_matmul_params + 6 * self.config.n_embd

    @property
    def adapter_params(self) -> int:
        return 2 * self.config.n_embd**2

    @property
    def head_params(self) -> int:
        """The head's weights, tied to the embedding (counted once in ``parameters``)."""
        return self.config.vocab_size * self.config.n_embd

    @property
    def outer_layers(self) -> int:
        """Prelude and coda blocks: run once per forward."""
        return self.config.n_layers_in_prelude + self.config.n_layers_in_coda

    @property
    def parameters(self) -> int:
        """Every parameter, the tied embedding once (equals ``RecurrentLM.num_parameters()``)."""
        c = self.config
        blocks = self.outer_layers + c.n_layers_in_recurrent_block
        return blocks * self.block_params + self.adapter_params + self.head_params + c.n_embd

    @property
    def core_parameters(self) -> int:
        """Parameters iterated per core step: the core blocks and the adapter."""
        return self.config.n_layers_in_recurrent_block * self.block_params + self.adapter_params

    def layer_calls(self, r: int) -> int:
        """Sandwich-block calls of one forward at ``r`` iterations: l_P + l_C + r·l_R."""
        return self.outer_layers + r * self.config.n_layers_in_recurrent_block

    def unrolled_parameters(self, r: int) -> int:
        """Weights a token multiplies by at depth ``r`` (the core and adapter ``r`` times)."""
        iterated = self.config.n_layers_in_recurrent_block * self.block_matmul_params
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
        per_position = 2 * self.config.n_embd * dtype_bytes(dtype)
        return float(per_position * (context + 1) * self.layer_calls(r))

    def decode_bytes_per_token(self, context: int, r: int, dtype: object) -> float:
        """Bytes one decoded token moves at batch 1: its weights and its KV-cache traffic."""
        return self.decode_weight_bytes(r, dtype) + self.decode_cache_bytes(context, r, dtype)

    # Recorded states ---------------------------------------------------------------------------
    def trajectory_bytes(self, positions: int, r: int, dtype: object = "float32") -> float:
        """Bytes of s_0 … s_r kept for ``positions`` token positions (one copy)."""
        return float(positions * (r + 1) * self.config.n_embd * dtype_bytes(dtype))
