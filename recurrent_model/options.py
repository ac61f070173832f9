"""What the two generation APIs share: argument checks, option configs, stop tokens, the streamer type.

``generate`` (:class:`generation.GenerationConfig`) and ``generate_diffusion``
(:class:`diffusion.DiffusionConfig`) take their options the same way: a frozen config and/or its
fields as keywords, checked here with one set of messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .config import ContextLengthError

if TYPE_CHECKING:
    from .model import RecurrentLM

#: ``streamer(tokens, steps)``: tokens that just became final and the core iterations spent on each.
#: ``generate`` calls it once per new position with one token per row, (B,) and (B,) (steps 0 for a
#: row that already stopped); ``generate_diffusion`` once per newly frozen run of its one row, (n,)
#: and (n,).
Streamer = Callable[[torch.Tensor, torch.Tensor], None]

Config = TypeVar("Config")


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_float(name: str, value: object, low: float, high: float | None = None) -> float:
    """``value`` as a float in [low, high] (high None: no upper bound), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not value >= low or (high is not None and not value <= high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return value


def replace_options(config: Config, api: str, per_call: str, **changes: Any) -> Config:
    """A copy of the frozen dataclass ``config`` with ``changes``; an unknown option name raises
    TypeError naming the known ones (``per_call``: the arguments ``api`` takes besides them)."""
    known = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(
            f"{api}() got unknown option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(sorted(known))} plus {per_call}"
        )
    if changes.get("stop_tokens") is not None:
        changes["stop_tokens"] = tuple(int(t) for t in changes["stop_tokens"])
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


def stop_tokens_for(model: RecurrentLM, stop_tokens: Iterable[int] | None) -> tuple[int, ...]:
    """The stop ids: ``stop_tokens`` if given, else the tokenizer's stop ids (none without one)."""
    if stop_tokens is None:
        tok = model.tokenizer
        stop_tokens = tuple(tok.stop_ids) if tok is not None else ()
    return tuple(sorted({int(t) for t in stop_tokens}))


def check_prompt(
    model: RecurrentLM, input_ids: object, max_new_tokens: object, rows: str = "batch"
) -> torch.Tensor:
    """``input_ids`` as long ids on the model's device after checking shape, dtype, vocabulary and
    context; ``rows`` names the batch dimension in the message ("batch", or "1" for one row)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty ({rows}, tokens) tensor of token ids")
    if input_ids.is_floating_point() or input_ids.is_complex():
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    new = check_int("max_new_tokens", max_new_tokens, 0)
    T, context = input_ids.shape[1], model.config.block_size
    if T > context:
        raise ContextLengthError(
            f"the prompt has {T} tokens but the model's context is {context} tokens (block_size)"
        )
    if T + new > context:
        raise ContextLengthError(
            f"a prompt of {T} tokens plus max_new_tokens={new} exceeds the model's "
            f"context of {context} tokens; lower max_new_tokens to at most {context - T}"
        )
    vocab = model.config.vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids must lie in [0, {vocab}) (the vocabulary)")
    return input_ids.to(device=model.device, dtype=torch.long)
