"""The looped-LM families this project loads, found by config.json's ``model_type``.

A family is one module under ``recurrent_model`` with a ``load_family(directory, raw_config, label,
device, dtype, require_tokenizer)`` function that returns its model in eval mode. Every family's
model has the same interface (:class:`~recurrent_model.hooked.HookedModel`: ``model(ids,
num_steps=r)``, ``run_with_cache``, ``hooks``, ``hook_names``, states s_0 … s_r at
``core.hook_state``). Adding a family is one module and one line of :data:`FAMILIES`
(docs/contributing.md says how).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module
from typing import Any

import torch

from .checkpoint import checkpoint_directory, read_config_json
from .config import ConfigError


@dataclass(frozen=True)
class Family:
    """One family: its name as the app and the docs show it, the ``model_type`` its config.json
    carries, the module whose ``load_family`` reads it, and, where several families share a
    ``model_type``, the module's ``claims(raw_config)`` says which configs are its own.
    ``classes`` names the config and model classes ("module:Name"); ``trains``: the pretraining
    pipeline (pretrain/trainer.py) trains this family's model (its forward takes ``labels``,
    ``generator`` and ``backprop_depth``)."""

    name: str
    model_type: str
    module: str
    classes: tuple[str, str]
    shares_model_type: bool = False
    trains: bool = False

    def config_class(self) -> type:
        return _attribute(self.classes[0])

    def model_class(self) -> type:
        return _attribute(self.classes[1])

    def claims(self, raw_config: dict[str, Any]) -> bool:
        if raw_config.get("model_type", DEFAULT_MODEL_TYPE) != self.model_type:
            return False
        return not self.shares_model_type or import_module(f".{self.module}", __package__).claims(
            raw_config
        )


#: In the order they are asked: a family that shares its ``model_type`` comes before the one
#: that takes the rest of that type.
FAMILIES = (
    Family("Ouro", "ouro", "ouro", ("ouro:OuroConfig", "ouro:OuroLM")),
    Family(
        "Retrofitted",
        "huginn_raven",
        "retrofit",
        ("retrofit:RetrofitConfig", "retrofit:RetrofitLM"),
        shares_model_type=True,
        trains=True,
    ),  # fmt: skip
    Family(
        "Huginn",
        "huginn_raven",
        "checkpoint",
        ("config:RecurrentConfig", "model:RecurrentLM"),
        trains=True,
    ),  # fmt: skip
)
#: config.json files written before ``model_type`` was required are Huginn's layout.
DEFAULT_MODEL_TYPE = "huginn_raven"


def family_of(raw_config: dict[str, Any]) -> Family:
    """The first family of :data:`FAMILIES` that claims ``raw_config``; ConfigError naming the
    known model types when none does."""
    for family in FAMILIES:
        if family.claims(raw_config):
            return family
    known = ", ".join(f"{f.model_type!r} ({f.name})" for f in FAMILIES)
    model_type = raw_config.get("model_type", DEFAULT_MODEL_TYPE)
    raise ConfigError(
        f"config.json has model_type {model_type!r}, which no family here loads; known: {known}"
    )


def load_model(
    path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    require_tokenizer: bool = False,
) -> Any:
    """Load a checkpoint directory (or hub id) of any family, in eval mode.

    The family comes from config.json's ``model_type``. ``dtype=None`` (or "auto") keeps the dtype
    the checkpoint stores; ``device`` defaults to the CPU. A path that does not exist but looks like a
    hub id ("org/name") is resolved through huggingface_hub's cache. Anything that is not a loadable
    checkpoint raises CheckpointError / ConfigError / TokenizerError naming the problem.
    """
    directory, label = checkpoint_directory(path)
    raw = read_config_json(directory)
    family = family_of(raw)
    load = import_module(f".{family.module}", __package__).load_family
    return load(directory, raw, label, device, dtype, require_tokenizer)


def _attribute(path: str) -> Any:
    """``"module:Name"`` of this package -> the object."""
    module, _, name = path.partition(":")
    return getattr(import_module(f".{module}", __package__), name)


def family_config(raw_config: dict[str, Any]) -> tuple[Family, Any]:
    """The family that claims a config.json mapping and its config object read from it
    (ConfigError naming the problem otherwise)."""
    family = family_of(raw_config)
    return family, family.config_class().from_dict(raw_config)


def family_of_config(config: Any) -> Family:
    """The family whose config class ``config`` is (ValueError for anything else)."""
    for family in FAMILIES:
        if type(config) is family.config_class():
            return family
    raise ValueError(f"{type(config).__name__} is the config of no family here")


def empty_model(config: Any) -> Any:
    """The model of ``config``'s family on the meta device: names and shapes, no storage (the
    caller materialises and fills it)."""
    with torch.device("meta"):
        return family_of_config(config).model_class()(config)
