"""Cached analyses keyed by what they analyse.

``@cached_analysis(keyed=("traj",))`` wraps ``st.cache_data``: the parameters named in ``keyed``
(a trajectory, a model, a checkpoint run) are not hashed but stand in the cache key through their
``cache_key`` attribute, which ``apps.compute`` sets (``load``, ``trajectory``, ``CheckpointRun``).
A value without one is an error, and no call passes a key of its own, so none can be forgotten or
name other inputs. Every other parameter is hashed as usual, except those named with a leading
underscore: progress bars, and values the keyed ones determine (the token texts of a trajectory,
the model it was collected with).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import streamlit as st

T = TypeVar("T")


class MissingCacheKey(TypeError):
    """A keyed input of a cached analysis carries no ``cache_key``."""


def cache_key(value: object, name: str = "value") -> Hashable:
    """The identity ``value`` carries for the cache; MissingCacheKey when it has none."""
    key = getattr(value, "cache_key", None)
    if key is None:
        raise MissingCacheKey(
            f"{name} ({type(value).__name__}) has no cache_key: cached analyses take the objects "
            "apps.compute makes (the trajectory from compute.trajectory), or set one that names "
            "everything the object was made from."
        )
    return key


def with_key(value: T, key: Hashable) -> T:
    """``value`` with its ``cache_key`` set to ``key``."""
    value.cache_key = key  # type: ignore[attr-defined]
    return value


def cached_analysis(
    *, keyed: tuple[str, ...], max_entries: int, show_spinner: bool | str = False
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Cache ``fn`` with st.cache_data under the cache keys of its ``keyed`` parameters and the
    hashes of its other parameters (those with a leading underscore left out)."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        signature = inspect.signature(fn)
        unknown = set(keyed) - set(signature.parameters)
        if unknown or not keyed:
            raise TypeError(f"{fn.__qualname__}: keyed names no parameter of it: {keyed}")

        def by_key(keys: tuple, settings: tuple, _call: Callable[[], T]) -> T:
            return _call()

        by_key.__module__, by_key.__qualname__ = fn.__module__, fn.__qualname__
        by_key.__name__ = fn.__name__
        cached = st.cache_data(max_entries=max_entries, show_spinner=show_spinner)(by_key)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            keys = tuple(cache_key(bound.arguments[name], name) for name in keyed)
            settings = tuple(
                (name, value)
                for name, value in bound.arguments.items()
                if name not in keyed and not name.startswith("_")
            )
            return cached(keys, settings, lambda: fn(*bound.args, **bound.kwargs))

        wrapper.clear = cached.clear  # type: ignore[attr-defined]
        return wrapper

    return decorate
