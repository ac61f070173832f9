"""Named hook points on every activation, TransformerLens-style.

A :class:`HookPoint` is a plain callable placed in the forward pass. With no functions attached it returns
its input untouched (one attribute check), so an un-hooked forward pays nothing measurable. Functions
attached to it receive ``(tensor, hook)`` and may return a tensor that replaces the activation.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .hook_names import first_step

HookFn = Callable[[torch.Tensor, "Hook"], "torch.Tensor | None"]


class HookError(ValueError):
    """A hook name that does not exist, or a hook that returned an unusable replacement."""


@dataclass(frozen=True)
class Hook:
    """What a hook function is told about the call: the hook's name and, for core hooks, the step.

    ``step`` is the 1-based core iteration (0 for the initial state s_0 at ``core.hook_state``) and
    ``None`` for hooks outside the recurrence.
    """

    name: str
    step: int | None = None


class HookPoint:
    """An identity in the forward pass that calls the functions attached to it."""

    __slots__ = ("name", "fns", "iterated")

    def __init__(self, name: str, iterated: bool = False) -> None:
        self.name = name
        self.iterated = iterated  # fires once per core iteration
        self.fns: list[HookFn] = []

    def __call__(self, x: torch.Tensor, step: int | None = None) -> torch.Tensor:
        if not self.fns:
            return x
        hook = Hook(self.name, step)
        for fn in self.fns:
            out = fn(x, hook)
            if out is not None:
                if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise HookError(
                        f"hook on {self.name!r} returned {got}; a replacement must be a tensor of "
                        f"the activation's shape {tuple(x.shape)}"
                    )
                x = out.to(x.dtype)
        return x

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r}, {len(self.fns)} fn)"


def name_matcher(names_filter: object) -> Callable[[str], bool]:
    """Turn a hook-name filter (a name, a list of names, a predicate or None = all) into a predicate."""
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if callable(names_filter):
        return names_filter  # type: ignore[return-value]
    if isinstance(names_filter, list | tuple | set | frozenset):
        wanted = set(names_filter)
        return lambda name: name in wanted
    raise HookError(
        f"names_filter must be a hook name, a list of names or a predicate, got {names_filter!r}"
    )


def closest_names(name: str, names: Sequence[str], n: int = 3) -> list[str]:
    """Up to ``n`` hook names most like ``name`` (a typo's likely intent), best first."""
    found = difflib.get_close_matches(name, list(names), n=n, cutoff=0.0)
    return found or list(names)[:n]


def unknown_hook(name: str, names: Sequence[str]) -> HookError:
    """The one-line error for a hook name that does not exist, naming the closest ones."""
    near = ", ".join(repr(c) for c in closest_names(name, names))
    return HookError(
        f"no hook named {name!r}; closest: {near} (model.hook_names() lists all {len(names)})"
    )


def unmatched_predicate(predicate: object, names: Sequence[str]) -> HookError:
    """The one-line error for a predicate that accepts no hook name: a named function's closest
    names, or the model's top-level hook names for a lambda."""
    label = getattr(predicate, "__name__", None) or repr(predicate)
    if label == "<lambda>":
        shown = [n for n in names if n.count(".") <= 1][:3]
    else:
        shown = closest_names(label, names)
    return HookError(
        f"the hook predicate {label} matches no hook point; closest names: "
        f"{', '.join(repr(c) for c in shown)} (model.hook_names() lists all {len(names)})"
    )


def check_filter(names_filter: object, names: Sequence[str]) -> None:
    """Raise a HookError when ``names_filter`` names a hook that does not exist or matches none."""
    if names_filter is None:
        return
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    if isinstance(names_filter, list | tuple | set | frozenset):
        for name in names_filter:
            if name not in names:
                raise unknown_hook(str(name), names)
        if not names_filter:
            raise HookError("names_filter is empty: it matches no hook point (None records all)")
        return
    matcher = name_matcher(names_filter)
    if not any(matcher(n) for n in names):
        raise unmatched_predicate(names_filter, names)


class ActivationCache(dict):
    """Activations recorded by ``run_with_cache``: hook name -> tensor.

    Hooks that fire once per core iteration are stacked along a leading step axis:
    ``core.hook_state`` is (num_steps + 1, B, T, h) holding s_0 … s_r, other per-iteration hooks
    (``core.{j}.*``, ``core.hook_adapter``) are (num_steps, B, T, h) for steps 1 … r.
    """

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return super().__getitem__(key)
        except KeyError:
            known = ", ".join(sorted(self)) or "nothing"
            raise KeyError(f"{key!r} was not recorded; the cache holds: {known}") from None

    def at(self, name: str, step: int) -> torch.Tensor:
        """The activation of per-iteration hook ``name`` at core ``step``, in the one numbering.

        ``core.hook_state`` answers steps 0 … r (s_0 … s_r); other per-iteration hooks 1 … r.
        """
        stacked = self[name]
        first = first_step(name)
        last = first + stacked.shape[0] - 1
        if not first <= step <= last:
            raise IndexError(f"{name!r} holds steps {first} … {last}, got step {step}")
        return stacked[step - first]
