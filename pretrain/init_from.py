"""``launch.py --init-from CHECKPOINT``: a run that starts from a converted checkpoint's weights
(fresh optimizer, step 0) instead of a random initialisation.

The checkpoint's config.json names its family (``recurrent_model.families``), and that family's
config class and model class are the run's. Everything about the directory is checked before a run
starts, each refusal one line: a missing directory or config.json, a family this route does not
train, a ``--set model.overrides`` that differs from the checkpoint's config, and weights whose
names or shapes (read from the safetensors headers, so a truncated file is refused too) do not match
the config. The weights are then read one tensor at a time while the model is built
(``pretrain.distributed.build_model``).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from recurrent_model.checkpoint import (
    CheckpointError,
    read_config_json,
    read_headers,
    weight_files,
)
from recurrent_model.config import ConfigError
from recurrent_model.families import empty_model, family_config

#: The families --init-from starts from: the checkpoints ``python -m pretrain.retrofit`` writes.
INIT_FROM_FAMILIES = ("Retrofitted",)


class InitFromError(ValueError):
    """A --init-from checkpoint this run cannot start from; the message says why in one line."""


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def init_from_config(directory: str | Path, overrides: dict[str, Any]) -> Any:
    """The config of the checkpoint in ``directory`` (its family's config class); InitFromError
    for a directory that is not one, a family other than :data:`INIT_FROM_FAMILIES`, or an
    override that differs from the checkpoint's value."""
    path = Path(directory)
    if not path.is_dir():
        raise InitFromError(f"--init-from {path}: no such checkpoint directory")
    try:
        family, config = family_config(read_config_json(path))
    except (CheckpointError, ConfigError) as exc:
        raise InitFromError(f"--init-from {path}: {one_line(exc)}") from None
    if family.name not in INIT_FROM_FAMILIES:
        raise InitFromError(
            f"--init-from {path}: its config.json is of the {family.name} family; --init-from "
            f"starts from a {' or '.join(INIT_FROM_FAMILIES)} checkpoint (python -m "
            "pretrain.retrofit writes one)"
        )
    check_overrides(path, config, overrides)
    return config


def check_overrides(path: Path, config: Any, overrides: dict[str, Any]) -> None:
    """A ``model.overrides`` key may only repeat the checkpoint's value."""
    written = config.to_dict()
    for key, value in overrides.items():
        held = getattr(config, key, written.get(key, _ABSENT))
        if held is _ABSENT:
            raise InitFromError(
                f"--set model.overrides.{key}: {path}/config.json has no field {key}; with "
                "--init-from the model is that checkpoint's"
            )
        if held != value:
            raise InitFromError(
                f"--set model.overrides.{key}={value!r} conflicts with --init-from {path}, whose "
                f"config.json has {key}={held!r}: the model is that checkpoint's"
            )


_ABSENT = object()


def check_weights(directory: str | Path, config: Any) -> None:
    """Every tensor name and shape the checkpoint stores against ``config``'s model (headers
    only, through the family's own ``check_against_model``); InitFromError otherwise."""
    path = Path(directory)
    family, _ = family_config(read_config_json(path))
    module = import_module(f"recurrent_model.{family.module}")
    try:
        headers = read_headers(path, weight_files(path))
        module.check_against_model(path, empty_model(config), headers)
    except CheckpointError as exc:
        raise InitFromError(f"--init-from {path}: {one_line(exc)}") from None


def stored_tensors(directory: str | Path, wanted: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The stored tensors named in ``wanted``, one at a time, in the checkpoint's dtype (names the
    model does not hold, such as a tied head or a RoPE table, are skipped)."""
    path = Path(directory)
    for name in weight_files(path):
        with safe_open(path / name, framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in wanted:
                    yield key, f.get_tensor(key)
