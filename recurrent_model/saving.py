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

from .atomic_io import atomic_directory

if TYPE_CHECKING:
    from .model import RecurrentLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TIED_HEAD = "lm_head.weight"  # tied to the embedding: never written


def write_checkpoint_files(
    model: RecurrentLM, directory: str | os.PathLike, max_shard_bytes: int | None = None
) -> None:
    """Write config.json, the weights (one file, or shards + index) and tokenizer.json into a directory."""
    directory = Path(directory)
    model.config.to_json(directory / "config.json")
    tensors = {
        k: v.detach().to("cpu").contiguous()
        for k, v in model.state_dict().items()
        if k != TIED_HEAD
    }
    metadata = {"format": "pt"}
    if max_shard_bytes is None:
        save_file(tensors, directory / SINGLE_FILE, metadata=metadata)
    else:
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
            save_file(shard, directory / name, metadata=metadata)
            weight_map.update({k: name for k in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save(directory / TOKENIZER_FILE)


def save_pretrained(
    model: RecurrentLM, path: str | os.PathLike, max_shard_bytes: int | None = None
) -> None:
    """Write the checkpoint atomically: a crash mid-write leaves ``path`` as it was."""
    with atomic_directory(path) as tmp:
        write_checkpoint_files(model, tmp, max_shard_bytes)
