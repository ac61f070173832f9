"""recurrent_model: the recurrent-depth language model (Huginn-0125 architecture) with hooks on every state."""

from . import hook_names
from .atomic_io import atomic_directory
from .checkpoint import CheckpointError, load_model
from .config import PRESETS, ConfigError, RecurrentConfig, preset
from .depth import Depth, sample_depth, split_depth
from .diffusion import DiffusionConfig, DiffusionOutput
from .generation import GenerationConfig, GenerationOutput
from .hooks import ActivationCache, Hook, HookError, HookPoint
from .kv_cache import KVCache, KVCacheTooLarge
from .model import ContextLengthError, ModelOutput, RecurrentLM
from .saving import save_pretrained
from .tokenizer import HuginnTokenizer, TokenizerError

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
