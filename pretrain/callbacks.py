"""Watching a training run without patching the trainer.

``Trainer(config, out, ctx, callbacks=[...])`` calls each callback's methods at fixed points of
``Trainer.run`` (the methods a callback does not define are skipped); ``launch.py --callback
MODULE:NAME`` builds callbacks in every rank by calling ``NAME()`` from ``MODULE``. The events, in
order:

    on_run_start(trainer)                   ``run`` begins (after a resume; also when nothing is left)
    on_step_start(trainer)                  before each optimizer step; ``trainer.step`` steps are done
    on_batch(trainer, inputs, labels)       each micro-batch as read from the loader (on the host)
    on_step_end(trainer, record)            after the optimizer step, before validation, logging and
                                            the checkpoint (which add keys to ``record`` later)
    on_run_end(trainer, summary)            ``run`` returns ``summary`` (not when it raises)

Every rank calls them at the same points, so a callback may run collectives (e.g. ``full_tensor``).
A callback must not keep the trainer or its model past ``on_run_end``: launch.py destroys the process
group after the run, and a DDP module still alive then hangs the exit.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .trainer import Trainer


class CallbackError(ValueError):
    """A ``--callback`` that cannot be loaded; the message says which and why."""


class TrainerCallback:
    """A base with every event as a no-op; subclass it and define the events you need."""

    def on_run_start(self, trainer: Trainer) -> None:
        """``Trainer.run`` begins."""

    def on_step_start(self, trainer: Trainer) -> None:
        """An optimizer step begins."""

    def on_batch(self, trainer: Trainer, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        """One micro-batch was read from the loader."""

    def on_step_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """An optimizer step (or a skipped update) is done; ``record`` is its metrics row."""

    def on_run_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """``Trainer.run`` returns ``summary``."""


def notify(callbacks: Sequence[object], event: str, trainer: Trainer, *args: Any) -> None:
    """Call ``event`` on every callback that defines it, in order."""
    for callback in callbacks:
        method = getattr(callback, event, None)
        if method is not None:
            method(trainer, *args)


def load_callback(spec: str) -> object:
    """The callback ``MODULE:NAME`` names: ``NAME()`` from the importable ``MODULE``."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise CallbackError(f"--callback expects MODULE:NAME, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CallbackError(f"--callback {spec}: cannot import {module_name!r} ({exc})") from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CallbackError(f"--callback {spec}: {module_name} has no callable {name!r}")
    return factory()
