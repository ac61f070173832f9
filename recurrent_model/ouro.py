"""Ouro (ByteDance, "Scaling Latent Reasoning via Looped Language Models"): the whole decoder stack
looped r times, a shared final norm after every loop whose output the next loop reads, and a learned
exit gate on every loop's state.

s_0 = Embedding(x)                                          (no scale, no random state)
s_i = norm( Layers(s_{i−1}) ),  i = 1 … r                  (the same layers and RoPE every loop)
λ_i = sigmoid( gate(s_i) ),  p_i = λ_i ∏_{j<i} (1 − λ_j),  p_r = ∏_{j<r} (1 − λ_j)
logits = lm_head(s_r)   (or lm_head(s_k) at the first loop k whose Σ_{i≤k} p_i ≥ exit_threshold)

Each layer has sandwich norms: x = x + norm_in2(Attn(norm_in(x))); x = x + norm_post2(MLP(norm_post(x))),
with grouped-query attention, rotate-half RoPE and, on the layers ``layer_types`` marks, a sliding
window. Weight names are the published ``OuroForCausalLM``'s (``model.layers.{i}.input_layernorm``,
``…input_layernorm_2``, ``…post_attention_layernorm``, ``…post_attention_layernorm_2``,
``model.norm``, ``model.early_exit_gate``). The KV cache keeps one slot per (loop, layer).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import hook_names
from . import llama_layers as ll
from .config import ConfigError, ContextLengthError
from .cost import CostLayout, ModelCost
from .hooked import HookedModel
from .hooks import HookPoint
from .model import ModelOutput

FULL, SLIDING = "full_attention", "sliding_attention"
EXIT_GATE = "core.hook_exit_gate"

# config.json fields the forward needs, and the values of others it implements.
REQUIRED_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
SUPPORTED_VALUES: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "rope_scaling": (None,),
    "attention_bias": (False,),
}


@dataclass
class OuroConfig:
    """The fields of Ouro's config.json that shape its function (others are kept in ``extra``)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 32768
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    total_ut_steps: int = 4
    tie_word_embeddings: bool = False
    layer_types: list[str] | None = None
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int = 28
    early_exit_threshold: float | None = 1.0
    torch_dtype: str = "float32"
    name: str = "ouro"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.layer_types is None:  # as the published config derives them
            self.layer_types = [
                SLIDING if self.use_sliding_window and i >= self.max_window_layers else FULL
                for i in range(self.num_hidden_layers)
            ]
        self.check()

    def check(self) -> None:
        """ConfigError naming the first field whose value this implementation cannot run."""
        positive = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "vocab_size", "num_key_value_heads", "max_position_embeddings", "total_ut_steps")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"config.json has {name}={value!r}; it must be an integer >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of "
                              f"num_attention_heads {self.num_attention_heads}")  # fmt: skip
        if self.num_attention_heads % self.num_key_value_heads:  # type: ignore[operator]
            raise ConfigError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads {self.num_key_value_heads}")  # fmt: skip
        types = self.layer_types or []
        if len(types) != self.num_hidden_layers or set(types) - {FULL, SLIDING}:
            raise ConfigError(f"config.json's layer_types {types!r} must name {FULL!r} or "
                              f"{SLIDING!r} for each of the {self.num_hidden_layers} layers")  # fmt: skip
        window = self.sliding_window
        if SLIDING in types and (not isinstance(window, int) or window < 1):
            raise ConfigError(
                f"a sliding_attention layer needs sliding_window >= 1, got {window!r}"
            )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> OuroConfig:
        """Read a parsed config.json; a missing field or a value not implemented is a ConfigError."""
        missing = [f for f in REQUIRED_FIELDS if f not in raw]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}, which an Ouro model needs")
        for key, allowed in SUPPORTED_VALUES.items():
            if key in raw and raw[key] not in allowed:
                raise ConfigError(f"config.json has {key}={raw[key]!r}, which this Ouro "
                                  f"implementation does not support (supported: {allowed})")  # fmt: skip
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in raw.items() if k in names}
        return cls(**known, extra={k: v for k, v in raw.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        out = {**self.extra, **{k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}}
        return {**out, "model_type": "ouro"}

    # The names the workbench reads of every family ---------------------------------------------
    @property
    def n_embd(self) -> int:
        """The width of the looped state."""
        return self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def block_size(self) -> int:
        """The context length."""
        return self.max_position_embeddings

    @property
    def mean_recurrence(self) -> int:
        """The default number of loops (``total_ut_steps``)."""
        return self.total_ut_steps

    @property
    def norm_eps(self) -> float:
        return self.rms_norm_eps

    @property
    def n_layers_in_recurrent_block(self) -> int:
        """Every layer is looped."""
        return self.num_hidden_layers

    @property
    def n_layers_in_prelude(self) -> int:
        """No layer runs before the loop."""
        return 0

    @property
    def n_layers_in_coda(self) -> int:
        """No layer runs after the loop: the head reads the last loop's state."""
        return 0

    @property
    def cost(self) -> ModelCost:
        """Parameters, FLOPs per token and decode bytes of this shape (recurrent_model/cost.py)."""
        return ModelCost(self)

    def cost_layout(self) -> CostLayout:
        """Every layer is a core layer (no prelude, coda or adapter): q, k, v, o and the SwiGLU
        projections, four norms per layer; the final norm and the exit gate (h + 1) besides."""
        h, inter, kv = self.hidden_size, self.intermediate_size, int(self.num_key_value_heads)  # type: ignore[arg-type]
        kv_dim = kv * self.head_dim
        block = {"q_proj": (h, h), "k_proj": (kv_dim, h), "v_proj": (kv_dim, h), "o_proj": (h, h),
                 "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}  # fmt: skip
        return CostLayout(h, self.vocab_size, block, 4 * h, 0, self.num_hidden_layers, None,
                          self.tie_word_embeddings, 2 * h + 1, 2 * kv_dim)  # fmt: skip

    def shape_summary(self) -> str:
        return (f"{self.num_hidden_layers} layers looped, h={self.hidden_size} "
                f"heads={self.num_attention_heads}/{self.num_key_value_heads} r={self.total_ut_steps}")  # fmt: skip


class Attention(nn.Module):
    def __init__(self, config: OuroConfig, window: int | None) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, int(config.num_key_value_heads)  # type: ignore[arg-type]
        self.window = window
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, cache: tuple[ll.SlotCache, int] | None
    ) -> torch.Tensor:
        q = ll.split_heads(self.q_proj(x), self.heads)
        k = ll.split_heads(self.k_proj(x), self.kv_heads)
        v = ll.split_heads(self.v_proj(x), self.kv_heads)
        return self.o_proj(ll.attention(q, k, v, rope, self.window, cache))


class MLP(nn.Module):
    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        h, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, inner, bias=False)
        self.up_proj = nn.Linear(h, inner, bias=False)
        self.down_proj = nn.Linear(inner, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ll.swiglu(x, self.gate_proj.weight, self.up_proj.weight))


class Layer(nn.Module):
    """One decoder layer with a norm before and after each sub-layer; hooks fire once per loop."""

    def __init__(self, config: OuroConfig, index: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        sliding = config.layer_types[index] == SLIDING  # type: ignore[index]
        self.input_layernorm = ll.RMSNorm(config.hidden_size, eps)
        self.self_attn = Attention(config, config.sliding_window if sliding else None)
        self.input_layernorm_2 = ll.RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = ll.RMSNorm(config.hidden_size, eps)
        self.mlp = MLP(config)
        self.post_attention_layernorm_2 = ll.RMSNorm(config.hidden_size, eps)
        names = hook_names.block(hook_names.layer(hook_names.CORE, index))
        self.hook_points = [HookPoint(name, iterated=True) for name in names]

    def forward(
        self, x: torch.Tensor, rope: torch.Tensor, step: int, cache: tuple[ll.SlotCache, int] | None
    ) -> torch.Tensor:
        attn_out, resid_mid, mlp_out, resid_post = self.hook_points
        a = attn_out(self.self_attn(self.input_layernorm(x), rope, cache), step)
        x = resid_mid(x + self.input_layernorm_2(a), step)
        m = mlp_out(self.mlp(self.post_attention_layernorm(x)), step)
        return resid_post(x + self.post_attention_layernorm_2(m), step)


class Stack(nn.Module):
    """The parameter container, laid out so that state_dict keys match Ouro's checkpoints."""

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = ll.RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.early_exit_gate = nn.Linear(config.hidden_size, 1)


class OuroLM(HookedModel):
    """An Ouro model with named hooks on every loop's state, every layer of every loop and the gate."""

    family = "Ouro"
    random_initial_state = False  # s_0 is the embedding: seeds and init_scale change nothing

    def __init__(self, config: OuroConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Stack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.tokenizer: Any = None
        self._rope: torch.Tensor | None = None
        self.hook_embed = HookPoint(hook_names.EMBED)
        self.hook_state = HookPoint(hook_names.STATE, iterated=True)
        self.hook_exit_gate = HookPoint(EXIT_GATE, iterated=True)
        self.hook_logits = HookPoint(hook_names.LOGITS)
        layer_points = [p for layer in self.model.layers for p in layer.hook_points]
        self.set_hook_points([self.hook_embed, self.hook_state, *layer_points,
                              self.hook_exit_gate, self.hook_logits])  # fmt: skip

    def default_steps(self) -> int:
        return self.config.total_ut_steps

    # The loop, piece by piece ------------------------------------------------------------------
    def rope_at(self, start: int, length: int) -> torch.Tensor:
        """RoPE cos/sin (2, length, head_dim) for positions start … start + length − 1."""
        end = start + length
        if end > self.config.block_size:
            raise ContextLengthError(f"sequence of {end} tokens exceeds the model's context of "
                                     f"{self.config.block_size} tokens (max_position_embeddings)")  # fmt: skip
        if self._rope is None or self._rope.device != self.device:
            cfg = self.config
            self._rope = ll.rope_table(cfg.head_dim, cfg.block_size, cfg.rope_theta, self.device)
        return self._rope[:, start:end]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hook_embed(self.model.embed_tokens(input_ids))

    def prelude(self, x: torch.Tensor, rope: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """Ouro has no prelude: the embedding is what the loop starts from."""
        return x

    def initial_state(
        self, e: torch.Tensor, init_scale: float = 1.0, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """s_0 = the embedding, whatever ``init_scale`` and ``generator`` say (no random state)."""
        return e

    def core_step(
        self,
        state: torch.Tensor,
        e: torch.Tensor | None,
        rope: torch.Tensor,
        step: int,
        cache: ll.SlotCache | None = None,
    ) -> torch.Tensor:
        """One loop s_{step−1} -> s_step = norm(layers(s_{step−1})); ``e`` is unused (no
        injection). Cache slot of layer j in loop ``step``: (step − 1) · layers + j."""
        n = self.config.num_hidden_layers
        x = state
        for j, layer in enumerate(self.model.layers):
            x = layer(x, rope, step, None if cache is None else (cache, (step - 1) * n + j))
        return self.model.norm(x)

    def exit_gate(self, state: torch.Tensor, step: int) -> torch.Tensor:
        """λ = sigmoid(gate(s)) (B, T) of one loop's state, float32."""
        return self.hook_exit_gate(torch.sigmoid(self.model.early_exit_gate(state)[..., 0]), step)

    def coda(self, state: torch.Tensor, rope: torch.Tensor | None = None, cache: Any = None):
        """The head on a loop's (already normed) state: (float32 logits, latents = the state)."""
        return self.lm_head(state).float(), state

    def state_norm(self) -> None:
        """None: every s_i is the output of the shared norm already, and the analyses compare it as
        it is."""
        return None

    # The forward pass ----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        num_steps: int | None = None,
        init_state: torch.Tensor | None = None,
        init_scale: float = 1.0,
        labels: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        *,
        exit_threshold: float | None = None,
        cache: ll.SlotCache | None = None,
        start: int = 0,
    ) -> ModelOutput:
        """Logits after ``num_steps`` loops (default ``total_ut_steps``) and the exit distribution
        (None after 0 loops, whose logits read s_0 directly: a patched or given state).

        ``init_state`` (B, T, h) replaces s_0 (the embedding); ``init_scale`` and ``generator`` are
        accepted for the shared interface and change nothing. ``exit_threshold`` t: each token's
        logits come from the first loop whose cumulative exit probability reaches t (the published
        ``exit_threshold``); None: the last loop. ``cache``/``start``: a KV cache and the position
        of the first token (generation).
        """
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}"
            )
        steps = self.default_steps() if num_steps is None else int(num_steps)
        if steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {steps}")
        rope = self.rope_at(start, input_ids.shape[1])
        if cache is not None:
            cache.begin(start)
        state = self.embed(input_ids)
        if init_state is not None:
            if init_state.shape != state.shape:
                raise ValueError(f"init_state has shape {tuple(init_state.shape)}, "
                                 f"expected {tuple(state.shape)}")  # fmt: skip
            state = init_state.to(device=state.device, dtype=state.dtype)
        state = self.hook_state(state, 0)
        states, gates = [], []
        for step in range(1, steps + 1):
            state = self.hook_state(self.core_step(state, None, rope, step, cache), step)
            states.append(state)
            gates.append(self.exit_gate(state, step))
        pdf = exit_pdf(torch.stack(gates, dim=-1).float()) if gates else None
        chosen = state
        if exit_threshold is not None and pdf is not None:
            chosen = exit_states(states, pdf, exit_threshold)
        logits, latents = self.coda(chosen)
        logits = self.hook_logits(logits)
        loss = None
        if labels is not None:
            flat = logits.flatten(0, 1)
            loss = F.cross_entropy(flat, labels.flatten().to(flat.device), ignore_index=-100)
        return ModelOutput(logits, latents, state, steps, loss, pdf)

    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int, num_steps: int | None = None, **options
    ) -> Any:
        """Autoregressive generation with a KV cache of one slot per (loop, layer); every token
        runs every loop. ``exit_criterion="exit-gate"`` with ``exit_threshold`` is the published
        exit rule; see :func:`recurrent_model.loop_generation.generate_every_loop` for the options."""
        from .loop_generation import generate_every_loop

        return generate_every_loop(self, input_ids, max_new_tokens, num_steps, **options)

    def loop_decode(self, batch: int, max_length: int, num_steps: int) -> Any:
        """Compiled decode tokens over static cache slots (generation's ``compile=True``)."""
        from .loop_compiled import LoopDecode

        return LoopDecode(self, batch, max_length, num_steps)

    def save_pretrained(self, path: str | Path) -> None:
        """Write config.json, model.safetensors in the published layout and tokenizer.json (when the
        model has a tokenizer), atomically."""
        from safetensors.torch import save_file

        from .atomic_io import atomic_directory
        from .saving import TOKENIZER_FILE

        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight")
        config = {**self.config.to_dict(), "torch_dtype": str(self.dtype).removeprefix("torch.")}
        with atomic_directory(path) as staging:
            (Path(staging) / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            save_file(tensors, str(Path(staging) / "model.safetensors"), metadata={"format": "pt"})
            if self.tokenizer is not None:
                self.tokenizer.save(Path(staging) / TOKENIZER_FILE)


def exit_pdf(gates: torch.Tensor) -> torch.Tensor:
    """The published exit distribution from per-loop λ (..., r): p_i = λ_i ∏_{j<i}(1 − λ_j) for
    i < r, and the last loop takes what remains."""
    remaining = torch.ones_like(gates[..., 0])
    probs = []
    for i in range(gates.shape[-1] - 1):
        probs.append(gates[..., i] * remaining)
        remaining = remaining * (1.0 - gates[..., i])
    probs.append(remaining)
    return torch.stack(probs, dim=-1)


def exit_steps(pdf: torch.Tensor, threshold: float) -> torch.Tensor:
    """Per token, the 0-based loop whose cumulative exit probability first reaches ``threshold``;
    the last loop where none does."""
    reached = pdf.cumsum(dim=-1) >= threshold
    last = torch.full_like(reached[..., 0], pdf.shape[-1] - 1, dtype=torch.long)
    return torch.where(reached.any(dim=-1), reached.long().argmax(dim=-1), last)


def exit_states(states: list[torch.Tensor], pdf: torch.Tensor, threshold: float) -> torch.Tensor:
    """Each token's state at its exit loop (:func:`exit_steps`)."""
    stacked = torch.stack(states, dim=0)  # (r, B, T, h)
    index = exit_steps(pdf, threshold)[None, ..., None].expand(1, *stacked.shape[1:])
    return stacked.gather(0, index)[0]


def load_family(
    directory: Path,
    raw: dict[str, Any],
    label: str | None,
    device: torch.device | str | None,
    dtype: torch.dtype | str | None,
    require_tokenizer: bool,
) -> OuroLM:
    """Load an Ouro checkpoint directory in the published layout, in eval mode: every tensor's name
    and shape is checked against the config before any is read."""
    from . import checkpoint as ck

    config = OuroConfig.from_dict(raw)
    if "name" not in raw:
        config.name = label or directory.resolve().name
    tokenizer = ck.family_tokenizer(directory, raw, config.vocab_size, require_tokenizer)
    with torch.device("meta"):
        model = OuroLM(config)
    files = ck.weight_files(directory)
    headers = ck.read_headers(directory, files)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    optional = frozenset({"lm_head.weight"} if config.tie_word_embeddings else ())
    problems = ck.check_tensors(expected, headers, optional)
    if problems:
        raise ck.CheckpointError(f"{directory} does not match its config "
                                 f"({config.shape_summary()}):\n  " + "\n  ".join(problems))  # fmt: skip
    device, target = ck.placement(raw, headers, device, dtype)
    with torch.no_grad():
        for key, stored in ck.file_tensors(directory, files):
            ck.set_parameter(model, key, stored.to(device=device, dtype=target))
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
    for p in model.parameters():
        p.requires_grad_(True)
    model.tokenizer = tokenizer
    return model.eval()
