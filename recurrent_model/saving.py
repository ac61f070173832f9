"""Writing checkpoints in the Hugging Face "huginn_raven" layout (safetensors only, atomically).

The writing half of the format lives below ``model`` (it needs no model class at run time), so
``RecurrentLM.save_pretrained`` can call it without an import cycle; ``checkpoint`` reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from .atomic_io import atomic_directory, new_file_mode

if TYPE_CHECKING:
    from .config import RecurrentConfig
    from .model import RecurrentLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TIED_HEAD = "lm_head.weight"  # tied to the embedding: never written


def write_checkpoint_files(
    model: RecurrentLM, directory: str | os.PathLike, max_shard_bytes: int | None = None
) -> None:
    """Write config.json, the weights (one file, or shards + index) and tokenizer.json into a directory.

    config.json's dtype fields name the dtype the tensors are written in, so that loading with
    ``dtype=None`` gives back the model as it was saved.
    """
    directory = Path(directory)
    tensors = {
        k: v.detach().to("cpu").contiguous()
        for k, v in model.state_dict().items()
        if k != TIED_HEAD
    }
    config_with_dtype(model.config, tensors).to_json(directory / "config.json")
    if max_shard_bytes is None:
        write_weights(tensors, directory / SINGLE_FILE)
    else:
        write_shards(tensors, directory, max_shard_bytes)
    if model.tokenizer is not None:
        model.tokenizer.save(directory / TOKENIZER_FILE)


def config_with_dtype(config: RecurrentConfig, tensors: dict[str, torch.Tensor]) -> RecurrentConfig:
    """``config`` with "torch_dtype" (and "dtype", when it carries that newer name) set to the
    dtype its floating-point tensors share; unchanged when they differ."""
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) != 1:
        return config
    name = str(dtypes.pop()).removeprefix("torch.")
    extra = {**config.extra, "dtype": name} if "dtype" in config.extra else config.extra
    return config.replace(torch_dtype=name, extra=extra)


def write_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """One safetensors file, readable like any new file (safetensors itself creates it 0600)."""
    save_file(tensors, path, metadata={"format": "pt"})
    os.chmod(path, new_file_mode())


def write_shards(tensors: dict[str, torch.Tensor], directory: Path, max_shard_bytes: int) -> None:
    """Shards of at most ``max_shard_bytes`` (a larger tensor gets one to itself) and their index."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_weights(shard, directory / name)
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def save_pretrained(
    model: RecurrentLM, path: str | os.PathLike, max_shard_bytes: int | None = None
) -> None:
    """Write the checkpoint atomically: a crash mid-write leaves ``path`` as it was.

    ``max_shard_bytes`` splits the weights into shards of at most that size plus an index.
    """
    if max_shard_bytes is not None and max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    with atomic_directory(path) as tmp:
        write_checkpoint_files(model, tmp, max_shard_bytes)
