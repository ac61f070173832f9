"""Reading and writing checkpoints in the Hugging Face "huginn_raven" layout (safetensors only).

Loading builds the model on the meta device, checks every tensor's name and shape from the safetensors
headers before reading any data, then streams tensors shard by shard, so peak memory stays near one model.
Writing goes to a temporary sibling directory that replaces the target only when complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from .config import ConfigError, RecurrentConfig
from .hub import HubError, download_checkpoint, looks_like_hub_id
from .model import RecurrentLM
from .saving import (  # noqa: F401 (the writing half of the format, re-exported for callers)
    INDEX_FILE,
    SINGLE_FILE,
    TIED_HEAD,
    TOKENIZER_FILE,
    save_pretrained,
    write_checkpoint_files,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Keys a checkpoint may carry that we recompute (RoPE table) or tie (head = embedding).
IGNORED_KEYS = ("freqs_cis",)
EMBEDDING = "transformer.wte.weight"


class CheckpointError(ValueError):
    """A directory that is not a loadable checkpoint; the message names the problem."""


# Locating the weights ----------------------------------------------------------------------------
def weight_files(directory: Path) -> dict[str, list[str]]:
    """Map each safetensors file of the checkpoint to the keys the index assigns it (an empty list
    for the single-file layout, whose header alone says what it holds)."""
    index = directory / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"{index} is not a valid index (needs a 'weight_map'): {exc}"
            ) from exc
        files: dict[str, list[str]] = {}
        for key, shard in weight_map.items():
            files.setdefault(shard, []).append(key)
        absent = [f for f in files if not (directory / f).is_file()]
        if absent:
            raise CheckpointError(
                f"{index} names shard(s) that are not in {directory}: {', '.join(sorted(absent))}"
            )
        return files
    if (directory / SINGLE_FILE).is_file():
        return {SINGLE_FILE: []}
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{directory} holds only pickle weights ({', '.join(pickles)}); this loader reads "
            "safetensors only and never unpickles files, which can run arbitrary code. Convert them "
            "to model.safetensors in a trusted environment first."
        )
    raise CheckpointError(
        f"{directory} has no weights: expected {SINGLE_FILE} or {INDEX_FILE} with its shards"
    )


def read_headers(directory: Path, files: dict[str, list[str]]) -> dict[str, tuple[str, tuple]]:
    """key -> (file, shape) from the safetensors headers, without reading tensor data."""
    found: dict[str, tuple[str, tuple]] = {}
    for name, indexed_keys in files.items():
        try:
            with safe_open(directory / name, framework="pt") as f:
                keys = list(f.keys())
                for key in keys:
                    found[key] = (name, tuple(f.get_slice(key).get_shape()))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(
                f"{directory / name} is not a readable safetensors file: {exc}"
            ) from exc
        missing_from_shard = sorted(set(indexed_keys) - set(keys))
        if missing_from_shard:
            raise CheckpointError(
                f"the index places {', '.join(missing_from_shard[:5])} in {name}, "
                "but that file does not hold them"
            )
    return found


def check_tensors(expected: dict[str, tuple], found: dict[str, tuple[str, tuple]]) -> list[str]:
    """Every mismatch between the model's tensors and the file's, as readable lines."""
    problems = []
    for key in sorted(set(expected) - set(found) - {TIED_HEAD}):
        problems.append(f"missing tensor {key} (expected shape {list(expected[key])})")
    for key in sorted(set(found) - set(expected) - set(IGNORED_KEYS)):
        problems.append(
            f"unexpected tensor {key} with shape {list(found[key][1])} in {found[key][0]}"
        )
    for key in sorted(set(found) & set(expected)):
        if tuple(found[key][1]) != tuple(expected[key]):
            problems.append(
                f"tensor {key} has shape {list(found[key][1])} in {found[key][0]}, "
                f"but the config needs {list(expected[key])}"
            )
    return problems


def checked_weight_files(directory: Path, model: RecurrentLM) -> dict[str, list[str]]:
    """The checkpoint's weight files, after checking every tensor name and shape against ``model``."""
    files = weight_files(directory)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = check_tensors(expected, read_headers(directory, files))
    if problems:
        raise CheckpointError(
            f"{directory} does not match its config ({model.config.shape_summary()}):\n  "
            + "\n  ".join(problems)
        )
    return files


@torch.no_grad()
def load_weights_into(model: RecurrentLM, path: str | os.PathLike) -> None:
    """Copy a checkpoint's weights into an existing model in place (its parameters stay the same
    objects, e.g. for an optimizer); names and shapes are checked first, shards read one at a time."""
    directory = Path(path)
    params = model.state_dict()
    for name in checked_weight_files(directory, model):
        with safe_open(directory / name, framework="pt", device="cpu") as f:
            for key in f.keys():
                if key not in IGNORED_KEYS and key != TIED_HEAD:
                    params[key].copy_(f.get_tensor(key))


def _set_parameter(model: nn.Module, key: str, value: torch.Tensor) -> None:
    module_path, _, attr = key.rpartition(".")
    module = model.get_submodule(module_path)
    setattr(module, attr, nn.Parameter(value, requires_grad=False))


# Loading -----------------------------------------------------------------------------------------
def load_model(
    path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> RecurrentLM:
    """Load a Huginn-layout checkpoint directory (one safetensors file or index + shards), in eval mode.

    A ``path`` that does not exist but looks like a hub id ("org/name", "org/name@revision") is
    resolved through huggingface_hub's cache (``recurrent_model.hub``; safetensors only).

    ``dtype`` defaults to float32; ``device`` to the CPU. Raises CheckpointError / ConfigError naming
    the problem for anything that is not a loadable checkpoint.
    """
    directory, label = Path(path), None
    # "org/name" with no local "org/" folder: a hub id (a typo under a local folder stays local)
    if not directory.exists() and not directory.parent.exists() and looks_like_hub_id(path):
        try:
            directory, label = download_checkpoint(os.fspath(path)), os.fspath(path)
        except HubError as exc:
            raise CheckpointError(f"no local checkpoint directory {path}, and {exc}") from exc
    if not directory.exists():
        # A save killed between its two renames leaves the previous checkpoint here, complete.
        moved = sorted(directory.parent.glob(f".{directory.name}.old-*"))
        hint = f"; an interrupted save left the previous checkpoint at {moved[-1]}" if moved else ""
        raise CheckpointError(f"checkpoint path {directory} does not exist{hint}")
    if not directory.is_dir():
        raise CheckpointError(
            f"{directory} is not a directory; a checkpoint is a directory holding config.json "
            "and safetensors weights"
        )
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory} has no config.json, so it is not a checkpoint")
    config = RecurrentConfig.from_json(config_path)
    if "name" not in config.extra and config.name == RecurrentConfig.name:
        config.name = label or directory.resolve().name
    device = torch.device(device) if device is not None else torch.device("cpu")
    dtype = resolve_dtype(dtype)

    with torch.device("meta"):
        model = RecurrentLM(config, init_weights=False)
    files = checked_weight_files(directory, model)

    head: torch.Tensor | None = None
    for name in files:
        with safe_open(directory / name, framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in IGNORED_KEYS:
                    continue
                tensor = f.get_tensor(key).to(device=device, dtype=dtype)
                if key == TIED_HEAD:
                    head = tensor
                    continue
                _set_parameter(model, key, tensor)
    model.lm_head.weight = model.transformer.wte.weight
    if head is not None and not torch.equal(head, model.transformer.wte.weight):
        raise CheckpointError(
            f"{directory} stores an lm_head.weight that differs from transformer.wte.weight, but "
            "this architecture ties the head to the embedding (tie_embeddings=true)"
        )
    del head
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if still_meta:  # pragma: no cover - check_tensors makes this unreachable
        raise CheckpointError(f"{directory} left parameters unset: {', '.join(still_meta)}")
    for p in model.parameters():
        p.requires_grad_(True)
    if (directory / TOKENIZER_FILE).is_file():
        from .tokenizer import HuginnTokenizer

        model.tokenizer = HuginnTokenizer.from_file(directory / TOKENIZER_FILE)
    return model.eval()


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """A torch dtype from None (float32), a dtype, or a name such as "bfloat16" or "bf16"."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ConfigError(f"unknown dtype {dtype!r}; choose from {', '.join(names)}")
    return names[dtype]
