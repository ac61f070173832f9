"""Thread settings for small models on the CPU for the app and the notebooks.

A small model's matrices are too small to split between threads, and on busy cores the threads
wait for each other, so one thread runs a small model's collection faster than two on a loaded
machine. Large models (and other devices) keep torch's default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits

SINGLE_THREAD_PARAMS = 100_000_000


def is_small_cpu_model(model) -> bool:
    """A model on the CPU with fewer than SINGLE_THREAD_PARAMS parameters."""
    return model.device.type == "cpu" and model.num_parameters() < SINGLE_THREAD_PARAMS


@contextmanager
def threads_for(model) -> Iterator[None]:
    """One torch and BLAS thread inside the block for a small CPU model; restored after."""
    with single_thread(is_small_cpu_model(model)):
        yield


@contextmanager
def kept_threads() -> Iterator[None]:
    """Torch's thread count as it was before the block, whatever the block set (a trainer run in
    the caller's process sets its own)."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def single_thread(small: bool) -> Iterator[None]:
    """One torch and BLAS thread inside the block when ``small``; restored after. For work that
    loads its own models (a checkpoint series): ``small`` from their config's parameter count,
    ``config.cost.parameters < SINGLE_THREAD_PARAMS``."""
    if not small:
        yield
        return
    with kept_threads(), threadpool_limits(1):
        torch.set_num_threads(1)
        yield


def prefer_single_thread(model) -> bool:
    """For a whole process (a notebook kernel): one torch thread when the model is small."""
    if is_small_cpu_model(model):
        torch.set_num_threads(1)
        return True
    return False
