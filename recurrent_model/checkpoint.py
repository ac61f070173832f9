"""Reading and writing checkpoints in the Hugging Face "huginn_raven" layout (safetensors only), and the
checks every family's loader shares (directory, config.json, headers, tensor names and shapes).

Loading builds the model on the meta device (no initialisation that the weights would overwrite),
checks the tokenizer and every tensor's name and shape from the safetensors headers before reading any
data, then streams tensors shard by shard in the checkpoint's own dtype unless told otherwise, so peak
memory stays near one model of that dtype.
Writing goes to a temporary sibling directory that replaces the target only when complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from torch import nn

from .config import ConfigError, RecurrentConfig
from .hub import HubError, download_checkpoint, looks_like_hub_id
from .json_files import read_json_object
from .model import RecurrentLM
from .saving import (  # noqa: F401 (the writing half of the format, re-exported for callers)
    INDEX_FILE,
    SINGLE_FILE,
    TIED_HEAD,
    TOKENIZER_FILE,
    save_pretrained,
    write_checkpoint_files,
)
from .tokenizer import HuginnTokenizer, PretrainedTokenizer, TokenizerError
from .training_shards import SHARDS_DIR, read_tensors, saved_shapes, training_shards

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Keys a checkpoint may carry that we recompute (RoPE table) or tie (head = embedding).
IGNORED_KEYS = ("freqs_cis",)
EMBEDDING = "transformer.wte.weight"
# safetensors' dtype names of the floating-point tensors a checkpoint may store.
TENSOR_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
}


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


class TensorHeader(NamedTuple):
    """What a safetensors header says of one tensor: its file, shape and dtype name ("F32", "BF16")."""

    file: str
    shape: tuple
    dtype: str


def read_headers(directory: Path, files: dict[str, list[str]]) -> dict[str, TensorHeader]:
    """key -> (file, shape, dtype) from the safetensors headers, without reading tensor data."""
    found: dict[str, TensorHeader] = {}
    for name, indexed_keys in files.items():
        try:
            with safe_open(directory / name, framework="pt") as f:
                keys = list(f.keys())
                for key in keys:
                    part = f.get_slice(key)
                    found[key] = TensorHeader(name, tuple(part.get_shape()), part.get_dtype())
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


def check_tensors(
    expected: dict[str, tuple],
    found: dict[str, TensorHeader],
    optional: frozenset[str] = frozenset({TIED_HEAD}),
) -> list[str]:
    """Every mismatch between the model's tensors and the file's, as readable lines; a tensor in
    ``optional`` may be absent (Huginn's head, tied to the embedding)."""
    problems = []
    for key in sorted(set(expected) - set(found) - optional):
        problems.append(f"missing tensor {key} (expected shape {list(expected[key])})")
    for key in sorted(set(found) - set(expected) - set(IGNORED_KEYS)):
        problems.append(
            f"unexpected tensor {key} with shape {list(found[key].shape)} in {found[key].file}"
        )
    for key in sorted(set(found) & set(expected)):
        if tuple(found[key].shape) != tuple(expected[key]):
            problems.append(
                f"tensor {key} has shape {list(found[key].shape)} in {found[key].file}, "
                f"but the config needs {list(expected[key])}"
            )
    return problems


def check_against_model(
    directory: Path, model: RecurrentLM, headers: dict[str, TensorHeader]
) -> None:
    """Raise CheckpointError listing every tensor name or shape in ``headers`` that ``model`` lacks."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = check_tensors(expected, headers)
    if problems:
        raise CheckpointError(
            f"{directory} does not match its config ({model.config.shape_summary()}):\n  "
            + "\n  ".join(problems)
        )


def checked_weight_files(directory: Path, model: RecurrentLM) -> dict[str, list[str]]:
    """The checkpoint's weight files, after checking every tensor name and shape against ``model``."""
    files = weight_files(directory)
    check_against_model(directory, model, read_headers(directory, files))
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


def set_parameter(model: nn.Module, key: str, value: torch.Tensor) -> None:
    """Replace the parameter ``key`` of ``model`` (a meta-device one) by ``value``, frozen."""
    module_path, _, attr = key.rpartition(".")
    module = model.get_submodule(module_path)
    setattr(module, attr, nn.Parameter(value, requires_grad=False))


# Loading -----------------------------------------------------------------------------------------
def load_family(
    directory: Path,
    raw: dict,
    label: str | None,
    device: torch.device | str | None,
    dtype: torch.dtype | str | None,
    require_tokenizer: bool,
) -> RecurrentLM:
    """Load a Huginn-layout checkpoint directory (one safetensors file or index + shards), in eval
    mode, from its parsed config.json ``raw`` (``recurrent_model.load_model`` picks the family).

    ``dtype=None`` (or "auto") keeps the dtype the checkpoint stores (``stored_dtype``), as "auto" does
    in the Hugging Face stack; ``device`` defaults to the CPU. The tokenizer is checked before any
    weight is read: a tokenizer.json whose vocabulary differs from the model's, or none at all when
    ``require_tokenizer`` is set, is refused. Raises CheckpointError / ConfigError / TokenizerError
    naming the problem for anything that is not a loadable checkpoint.

    Tensors loaded on the CPU in their stored dtype stay memory-mapped from the files (copy-on-write:
    changing a weight never writes to the file, and processes loading one checkpoint share its pages).
    Replace a loaded checkpoint's files by writing a new directory, as ``save_pretrained`` does, never
    by rewriting them in place.
    """
    config = RecurrentConfig.from_dict(raw)
    if "name" not in config.extra and config.name == RecurrentConfig.name:
        config.name = label or directory.resolve().name
    tokenizer = checked_tokenizer(directory, config, required=require_tokenizer)
    with torch.device("meta"):
        model = RecurrentLM(config, init_weights=False)
    headers, tensors = _stored_tensors(directory, model)
    check_against_model(directory, model, headers)
    device, target = placement(raw, headers, device, dtype)
    assign_weights(model, directory, tensors(), device, target)
    model.tokenizer = tokenizer
    return model.eval()


def _stored_tensors(
    directory: Path, model: RecurrentLM
) -> tuple[dict[str, TensorHeader], Callable[[], Iterable[tuple[str, torch.Tensor]]]]:
    """The headers of the weights a checkpoint stores, and a reader of its tensors: the Huginn-layout
    files, or, for a training checkpoint saved between exports, its distributed-checkpoint shards."""
    has_weights = (directory / SINGLE_FILE).is_file() or (directory / INDEX_FILE).is_file()
    shards = training_shards(directory, has_weights)
    if shards is None:
        files = weight_files(directory)
        return read_headers(directory, files), lambda: file_tensors(directory, files)
    expected = set(model.state_dict()) | set(IGNORED_KEYS)
    saved = {k: v for k, v in saved_shapes(shards).items() if k in expected}
    dtype_names = {v: k for k, v in TENSOR_DTYPES.items()}
    headers = {
        k: TensorHeader(SHARDS_DIR, shape, dtype_names.get(dtype, str(dtype)))
        for k, (shape, dtype) in saved.items()
    }
    return headers, lambda: read_tensors(shards, saved).items()


def checkpoint_directory(path: str | os.PathLike) -> tuple[Path, str | None]:
    """The local checkpoint directory for ``path`` (a hub id is fetched) and, for a hub id, its label."""
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
    return directory, label


def read_config_json(directory: Path) -> dict:
    """The checkpoint's config.json as a mapping (validated later by ``RecurrentConfig.from_dict``)."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory} has no config.json, so it is not a checkpoint")
    return read_json_object(config_path, ConfigError)


def checked_tokenizer(
    directory: Path, config: RecurrentConfig, required: bool
) -> HuginnTokenizer | None:
    """The checkpoint's tokenizer (None when it has none and none is ``required``), refused unless
    its vocabulary has exactly the model's ``vocab_size`` ids: a smaller one decodes the ids above
    its size to nothing, a larger one yields ids the embedding does not hold."""
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        if required:
            raise CheckpointError(
                f"{directory} has no {TOKENIZER_FILE} to encode a prompt; add the tokenizer the "
                "model was trained with next to config.json"
            )
        return None
    tokenizer = HuginnTokenizer.from_file(path)
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"{path} has {tokenizer.vocab_size:,} tokens but the model's vocab_size is "
            f"{config.vocab_size:,} (config.json): it is not this model's tokenizer"
        )
    return tokenizer


def placement(
    raw_config: dict,
    headers: dict[str, TensorHeader],
    device: torch.device | str | None,
    dtype: torch.dtype | str | None,
) -> tuple[torch.device, torch.dtype]:
    """Where and in which dtype a checkpoint's tensors are loaded: ``device`` (default the CPU),
    ``dtype`` (None or "auto": the dtype the checkpoint stores, :func:`stored_dtype`)."""
    target = (
        resolve_dtype(dtype) if dtype not in (None, "auto") else stored_dtype(raw_config, headers)
    )
    return (torch.device(device) if device is not None else torch.device("cpu")), target


def family_tokenizer(
    directory: Path, raw_config: dict, vocab_size: int, required: bool
) -> HuginnTokenizer | PretrainedTokenizer | None:
    """The tokenizer of another family's checkpoint (Ouro, retrofitted): Huginn's when the file
    carries Huginn's special tokens (a model this project made), else the checkpoint's own
    (:class:`PretrainedTokenizer`); None when there is none and none is ``required``. Refused when it
    has more ids than the model's vocabulary (ids the embedding does not hold); fewer is the padded
    embedding many published models have."""
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        if required:
            raise CheckpointError(f"{directory} has no {TOKENIZER_FILE} to encode a prompt")
        return None
    try:
        tokenizer: HuginnTokenizer | PretrainedTokenizer = HuginnTokenizer.from_file(path)
    except TokenizerError:
        tokenizer = PretrainedTokenizer.from_directory(directory, raw_config)
    if tokenizer.vocab_size > vocab_size:
        raise CheckpointError(
            f"{path} has {tokenizer.vocab_size:,} tokens but the model's vocabulary holds "
            f"{vocab_size:,}: it is not this model's tokenizer"
        )
    return tokenizer


def stored_dtype(raw_config: dict, headers: dict[str, TensorHeader]) -> torch.dtype:
    """The dtype a checkpoint declares: config.json's "torch_dtype" (or "dtype", its newer name),
    else the dtype its floating-point tensors share (float32 when they differ or there are none)."""
    for key in ("torch_dtype", "dtype"):
        name = raw_config.get(key)
        if isinstance(name, str) and name != "auto":
            try:
                return resolve_dtype(name.removeprefix("torch."))
            except ConfigError as exc:
                raise ConfigError(f"config.json has {key}={name!r}: {exc}") from exc
    found = {TENSOR_DTYPES[h.dtype] for h in headers.values() if h.dtype in TENSOR_DTYPES}
    return found.pop() if len(found) == 1 else torch.float32


def file_tensors(
    directory: Path, files: dict[str, list[str]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, tensor) for every stored tensor, shard by shard, memory-mapped from the files."""
    for name in files:
        with safe_open(directory / name, framework="pt", device="cpu") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


@torch.no_grad()
def assign_weights(
    model: RecurrentLM,
    directory: Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Give the meta-device ``model`` the checkpoint's ``tensors`` on ``device`` in ``dtype``; the
    head is tied to the embedding (a stored head must equal it)."""
    head: torch.Tensor | None = None
    for key, stored in tensors:
        if key in IGNORED_KEYS:
            continue
        tensor = stored.to(device=device, dtype=dtype)
        if key == TIED_HEAD:
            head = tensor
            continue
        set_parameter(model, key, tensor)
    model.lm_head.weight = model.transformer.wte.weight
    if head is not None and not torch.equal(head, model.transformer.wte.weight):
        raise CheckpointError(
            f"{directory} stores an lm_head.weight that differs from transformer.wte.weight, but "
            "this architecture ties the head to the embedding (tie_embeddings=true)"
        )
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if still_meta:  # pragma: no cover - check_tensors makes this unreachable
        raise CheckpointError(f"{directory} left parameters unset: {', '.join(still_meta)}")
    for p in model.parameters():
        p.requires_grad_(True)


DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
}


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """A torch dtype from None (float32), a dtype, or a name such as "bfloat16" or "bf16"."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[dtype]
