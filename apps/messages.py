"""Turn the errors bad input can cause into messages shown in the page instead of tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st
import torch

import recurrent_model
from workbench import TrajectoryTooLarge

from .inputs import InputError

USER_ERRORS = (
    InputError,
    recurrent_model.CheckpointError,
    recurrent_model.ConfigError,
    recurrent_model.TokenizerError,
    recurrent_model.ContextLengthError,
)
MEMORY_ERRORS = (TrajectoryTooLarge, torch.OutOfMemoryError, MemoryError)


def describe(exc: BaseException) -> str | None:
    """The message to show for an expected error, or None for a bug (which should surface)."""
    if isinstance(exc, MEMORY_ERRORS) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    ):
        return (
            f"Out of memory: {exc}. Use fewer steps, seeds or tokens, a smaller dtype, "
            "or another device."
        )
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    if isinstance(exc, ValueError):  # workbench and the model check their inputs this way
        return f"Cannot compute this: {exc}"
    return None


@contextmanager
def shown_as_message(stop: bool = False) -> Iterator[None]:
    """Show an expected error as st.error (then st.stop() when ``stop``); re-raise anything else."""
    try:
        yield
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise
        st.error(message)
        if stop:
            st.stop()
