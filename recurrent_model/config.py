"""The model configuration: every field of the Huginn ``config.json``, read, validated and written.

Fields written by other tools (architectures, auto_map, init_values, head_dim, dtype, ...) are accepted
and ignored; fields whose value selects something we do not implement are refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cost import CostLayout, ModelCost


class ConfigError(ValueError):
    """A config.json that this project cannot turn into a model."""


class ContextLengthError(ValueError):
    """An input longer than the model's context (block_size)."""


# Fields a config.json must carry: everything that changes the computed function or the tensor shapes.
REQUIRED_FIELDS = (
    "n_embd",
    "n_heads",
    "n_layers_in_prelude",
    "n_layers_in_recurrent_block",
    "n_layers_in_coda",
    "intermediate_size",
    "vocab_size",
)

# Values this implementation supports; anything else selects another architecture.
SUPPORTED_VALUES: dict[str, tuple[Any, ...]] = {
    "model_type": ("huginn_raven",),
    "injection_type": ("linear",),
    "state_init": ("like-init",),
    "norm_class_name": ("RMSNorm_llama", "RMSNorm"),
    "block_class_name": ("SandwichBlock",),
    "mlp_class_name": ("GatedMLP",),
    "nonlin_name": ("SiLU",),
    "bias": (False,),
    "tie_embeddings": (True,),
    "qk_bias": (True,),
}


@dataclass
class RecurrentConfig:
    """Shape and hyper-parameters of a recurrent-depth model (prelude, core block iterated r times, coda)."""

    n_embd: int = 5280
    n_heads: int = 55
    n_layers_in_prelude: int = 2
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 2
    intermediate_size: int = 17920
    vocab_size: int = 65536
    padding_multiple: int = 4096
    block_size: int = 4096
    norm_eps: float = 1e-6
    rope_base: float = 50000.0
    mean_recurrence: int = 32
    mean_backprop_depth: int = 8
    qk_bias: bool = True
    bias: bool = False
    tie_embeddings: bool = True
    sampling_scheme: str = "poisson-lognormal-filling"
    injection_type: str = "linear"
    state_init: str = "like-init"
    init_strategy: str = "takase"
    torch_dtype: str = "float32"
    name: str = "recurrent-lm"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.n_embd % self.n_heads != 0:
            raise ConfigError(
                f"n_embd={self.n_embd} is not divisible by n_heads={self.n_heads}: "
                "heads must split the hidden size evenly"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        for name in (
            "n_embd",
            "n_heads",
            "intermediate_size",
            "vocab_size",
            "block_size",
            "n_layers_in_recurrent_block",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("n_layers_in_prelude", "n_layers_in_coda", "mean_backprop_depth"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.mean_recurrence < 1:
            raise ConfigError(f"mean_recurrence must be >= 1, got {self.mean_recurrence}")

    # Derived sizes -------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def n_layers(self) -> int:
        return self.n_layers_in_prelude + self.n_layers_in_recurrent_block + self.n_layers_in_coda

    @property
    def effective_depth(self) -> int:
        """l_P + r̄·l_R + l_C: the depth the Takase init scales the output projections by."""
        return (
            self.n_layers_in_prelude
            + self.mean_recurrence * self.n_layers_in_recurrent_block
            + self.n_layers_in_coda
        )

    @property
    def init_std(self) -> float:
        """σ = sqrt(2 / (5h)), the std of every weight and of the initial state before scaling."""
        return math.sqrt(2.0 / (5.0 * self.n_embd))

    @property
    def out_proj_std(self) -> float:
        return self.init_std / math.sqrt(2.0 * self.effective_depth)

    @property
    def cost(self) -> ModelCost:
        """Parameters, FLOPs per token and decode bytes of this shape (recurrent_model/cost.py)."""
        from .cost import ModelCost

        return ModelCost(self)

    def cost_layout(self) -> CostLayout:
        """Huginn's layout for the cost arithmetic: sandwich blocks (fused qkv, four norms and the
        qk bias: 6h other parameters), the adapter (h × 2h), the head tied to the embedding."""
        from .cost import CostLayout

        h, inter = self.n_embd, self.intermediate_size
        block = {"wqkv": (3 * h, h), "attn_proj": (h, h), "mlp_fc": (2 * inter, h),
                 "mlp_proj": (h, inter)}  # fmt: skip
        outer = self.n_layers_in_prelude + self.n_layers_in_coda
        return CostLayout(h, self.vocab_size, block, 6 * h, outer,
                          self.n_layers_in_recurrent_block, (h, 2 * h), True, h, 2 * h)  # fmt: skip

    def shape_summary(self) -> str:
        return (
            f"({self.n_layers_in_prelude}, {self.n_layers_in_recurrent_block}, "
            f"{self.n_layers_in_coda}) h={self.n_embd} heads={self.n_heads} r̄={self.mean_recurrence}"
        )

    # Serialisation -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The Huginn config.json fields (plus anything unknown we were given, passed through)."""
        out = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name in ("extra",):
                continue
            out[f.name] = getattr(self, f.name)
        out.update(
            model_type="huginn_raven",
            n_layers=self.n_layers,
            num_attention_heads=self.n_heads,
            num_key_value_heads=self.n_heads,
            head_dim=self.head_dim,
            hidden_size=self.n_embd,
            norm_class_name="RMSNorm_llama",
            block_class_name="SandwichBlock",
            mlp_class_name="GatedMLP",
            nonlin_name="SiLU",
            architectures=["RavenForCausalLM"],
        )
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecurrentConfig:
        """Build from a config.json mapping; refuse missing or unsupported fields with a clear error."""
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in data]
        if missing:
            raise ConfigError(f"config.json is missing required field(s): {', '.join(missing)}")
        for key, allowed in SUPPORTED_VALUES.items():
            if key in data and data[key] not in allowed:
                raise ConfigError(
                    f"config.json has {key}={data[key]!r}, which this implementation does not "
                    f"support (supported: {', '.join(repr(a) for a in allowed)})"
                )
        n_layers = data.get("n_layers")
        parts = (
            data["n_layers_in_prelude"]
            + data["n_layers_in_recurrent_block"]
            + data["n_layers_in_coda"]
        )
        if n_layers is not None and n_layers != parts:
            raise ConfigError(
                f"config.json has n_layers={n_layers} but prelude + core + coda = {parts}"
            )
        for alias in ("num_attention_heads", "num_key_value_heads"):
            if alias in data and data[alias] != data["n_heads"]:
                raise ConfigError(
                    f"config.json has {alias}={data[alias]} != n_heads={data['n_heads']}: "
                    "grouped key/value heads are not part of this architecture"
                )
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        try:
            config = cls(**kwargs, extra=extra)
        except TypeError as exc:  # pragma: no cover - defensive
            raise ConfigError(f"config.json could not be read: {exc}") from exc
        for name in ("n_embd", "n_heads", "intermediate_size", "vocab_size", "block_size"):
            setattr(config, name, int(getattr(config, name)))
        return config

    @classmethod
    def from_json(cls, path: str | Path) -> RecurrentConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def replace(self, **changes: Any) -> RecurrentConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, dict[str, Any]] = {
    # The published Huginn-0125 shape.
    "huginn-0125": dict(),
    # Small shapes for tests, CPU benchmarks and CPU training.
    "tiny": dict(
        n_embd=64,
        n_heads=4,
        n_layers_in_prelude=1,
        n_layers_in_recurrent_block=2,
        n_layers_in_coda=1,
        intermediate_size=128,
        vocab_size=512,
        padding_multiple=64,
        block_size=128,
        mean_recurrence=4,
        mean_backprop_depth=2,
        name="tiny",
    ),
    "small": dict(
        n_embd=256,
        n_heads=4,
        n_layers_in_prelude=1,
        n_layers_in_recurrent_block=2,
        n_layers_in_coda=1,
        intermediate_size=704,
        vocab_size=4096,
        padding_multiple=64,
        block_size=512,
        mean_recurrence=8,
        mean_backprop_depth=4,
        name="small",
    ),
}


def preset(name: str, /, **overrides: Any) -> RecurrentConfig:
    """A named configuration (``huginn-0125``, ``tiny``, ``small``) with optional overrides; the
    preset's name is positional-only, so ``name=...`` among the overrides renames the config."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    fields = {"name": name, **PRESETS[name], **overrides}
    return RecurrentConfig(**fields)
