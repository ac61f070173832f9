"""recurrent_model: the recurrent-depth language model (Huginn-0125 architecture) with hooks on every state."""

from importlib import import_module
from typing import TYPE_CHECKING

from . import hook_names
from .cpu_kernels import configure as _configure_cpu_kernels

_configure_cpu_kernels()

# Each public name and the submodule it lives in: imported on first use (PEP 562), so that
# ``python -m recurrent_model`` can refuse bad arguments before torch is imported.
_HOMES = {
    "atomic_directory": "atomic_io",
    "CheckpointError": "checkpoint",
    "load_model": "families",
    "PRESETS": "config",
    "ConfigError": "config",
    "RecurrentConfig": "config",
    "preset": "config",
    "Depth": "depth",
    "sample_depth": "depth",
    "split_depth": "depth",
    "DiffusionConfig": "diffusion",
    "DiffusionOutput": "diffusion",
    "GenerationConfig": "generation",
    "GenerationOutput": "generation",
    "ActivationCache": "hooks",
    "Hook": "hooks",
    "HookError": "hooks",
    "HookPoint": "hooks",
    "KVCache": "kv_cache",
    "KVCacheTooLarge": "kv_cache",
    "ContextLengthError": "model",
    "ModelOutput": "model",
    "RecurrentLM": "model",
    "save_pretrained": "saving",
    "HuginnTokenizer": "tokenizer",
    "TokenizerError": "tokenizer",
}

if TYPE_CHECKING:
    from .atomic_io import atomic_directory
    from .checkpoint import CheckpointError
    from .config import PRESETS, ConfigError, RecurrentConfig, preset
    from .depth import Depth, sample_depth, split_depth
    from .diffusion import DiffusionConfig, DiffusionOutput
    from .families import load_model
    from .generation import GenerationConfig, GenerationOutput
    from .hooks import ActivationCache, Hook, HookError, HookPoint
    from .kv_cache import KVCache, KVCacheTooLarge
    from .model import ContextLengthError, ModelOutput, RecurrentLM
    from .saving import save_pretrained
    from .tokenizer import HuginnTokenizer, TokenizerError


def __getattr__(name: str) -> object:
    """A public name (or a submodule) imported on first use."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(import_module(f".{home}", __name__), name)
        globals()[name] = value
        return value
    try:
        return import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "PRESETS",
    "ActivationCache",
    "CheckpointError",
    "ConfigError",
    "ContextLengthError",
    "Depth",
    "DiffusionConfig",
    "DiffusionOutput",
    "GenerationConfig",
    "GenerationOutput",
    "Hook",
    "HookError",
    "HookPoint",
    "HuginnTokenizer",
    "KVCache",
    "KVCacheTooLarge",
    "ModelOutput",
    "RecurrentConfig",
    "RecurrentLM",
    "TokenizerError",
    "atomic_directory",
    "load_model",
    "preset",
    "sample_depth",
    "save_pretrained",
    "hook_names",
    "split_depth",
]
