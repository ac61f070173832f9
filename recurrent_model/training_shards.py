"""Reading a training checkpoint that was saved between exports: only its sharded weights exist.

The trainer writes every checkpoint as torch distributed-checkpoint (DCP) safetensors pieces under
``shards/`` and consolidates the Huginn layout only every ``train.export_every`` checkpoints. This module
assembles the full tensors from those pieces in one process, so ``load_model`` opens any checkpoint.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

SHARDS_DIR = "shards"


def training_shards(directory: Path, has_weights: bool) -> Path | None:
    """The DCP shard directory to read when ``directory`` holds no consolidated weights, else None."""
    shards = directory / SHARDS_DIR
    if has_weights or not shards.is_dir() or not any(shards.glob("*.safetensors")):
        return None
    return shards


def saved_shapes(shards: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Key -> (full shape, dtype) of every tensor the shards hold (headers only)."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.HuggingFaceStorageReader(str(shards)).read_metadata()
    return {
        key: (tuple(meta.size), meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if hasattr(meta, "size")
    }


def read_tensors(shards: Path, wanted: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict:
    """The full tensors ``wanted`` (key -> (shape, dtype)) assembled from the shards on the CPU."""
    import torch.distributed.checkpoint as dcp

    state = {key: torch.empty(shape, dtype=dtype) for key, (shape, dtype) in wanted.items()}
    with warnings.catch_warnings():  # one process by design, not a missing process group
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=dcp.HuggingFaceStorageReader(str(shards)), no_dist=True)
    return state
