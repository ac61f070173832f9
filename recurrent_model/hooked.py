"""The interface every looped-LM family shares: named hook points, ``hooks``, ``run_with_cache``,
the model's name, device and dtype.

A family's model subclasses :class:`HookedModel`, creates its :class:`~recurrent_model.hooks.HookPoint`
objects in forward order and registers them with :meth:`HookedModel.set_hook_points`; its
``forward(input_ids, num_steps=..., init_state=..., **kw)`` calls them. Per-iteration points record
one tensor per step: ``core.hook_state`` s_0 … s_r, every other point steps 1 … r.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from . import hook_names
from .hooks import (
    ActivationCache,
    HookError,
    HookFn,
    HookPoint,
    check_filter,
    name_matcher,
    unknown_hook,
    unmatched_predicate,
)


class HookedModel(nn.Module):
    """What every family's model shares: hook points by name, attachable for a ``with`` block, a
    forward that records them, and its name, device and dtype (those of its first parameter, the
    token embedding in every family)."""

    _hook_points: dict[str, HookPoint]
    config: Any

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def num_parameters(self) -> int:
        """Parameter count, a tied head once."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def set_hook_points(self, points: Sequence[HookPoint]) -> None:
        """Register the model's hook points, in the order they fire within one forward pass."""
        self._hook_points = {p.name: p for p in points}

    def default_steps(self) -> int:
        """The number of iterations a forward runs when ``num_steps`` is None."""
        raise NotImplementedError

    def hook_names(self) -> list[str]:
        """Every hook name, in the order the hooks fire within one iteration of the forward pass."""
        return list(self._hook_points)

    def has_hooks(self) -> bool:
        """True while any hook function is attached (generation then runs the hooked path)."""
        return any(p.fns for p in self._hook_points.values())

    def hook_point(self, name: str) -> HookPoint:
        try:
            return self._hook_points[name]
        except KeyError:
            raise unknown_hook(str(name), list(self._hook_points)) from None

    def _resolve(self, name_or_predicate: str | Callable[[str], bool]) -> list[HookPoint]:
        """The hook points a name or predicate selects; selecting none is a HookError."""
        if isinstance(name_or_predicate, str):
            return [self.hook_point(name_or_predicate)]
        if callable(name_or_predicate):
            points = [p for n, p in self._hook_points.items() if name_or_predicate(n)]
            if not points:
                raise unmatched_predicate(name_or_predicate, list(self._hook_points))
            return points
        raise HookError(f"a hook is named by a string or a predicate, got {name_or_predicate!r}")

    @contextmanager
    def hooks(
        self, fwd_hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = ()
    ) -> Iterator[HookedModel]:
        """Attach ``fn(tensor, hook)`` to hook points for the duration of a ``with`` block.

        A function may return a tensor that replaces the activation (patching, steering, ablation).
        Hooks are removed on exit, also when the block raises.
        """
        added: list[tuple[HookPoint, HookFn]] = []
        try:
            for name_or_predicate, fn in fwd_hooks:
                for point in self._resolve(name_or_predicate):
                    point.fns.append(fn)
                    added.append((point, fn))
            yield self
        finally:
            for point, fn in reversed(added):
                point.fns.remove(fn)

    def reset_hooks(self) -> None:
        """Remove every attached hook function."""
        for point in self._hook_points.values():
            point.fns.clear()

    def run_with_cache(
        self,
        input_ids: torch.Tensor,
        num_steps: int | None = None,
        init_state: torch.Tensor | None = None,
        names_filter: Any = None,
        cache_device: torch.device | str | None = None,
        cache_dtype: torch.dtype | None = None,
        **forward_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """Forward pass that records the activations of every hook accepted by ``names_filter``.

        Per-iteration hooks are stacked: ``cache[hook_names.STATE]`` is (num_steps + 1, B, T, h) with
        s_0 … s_r; ``cache.at(name, step)`` reads one step. ``cache_device`` (e.g. "cpu") and
        ``cache_dtype`` (e.g. torch.float16) shrink recordings of big runs.
        """
        steps = self.default_steps() if num_steps is None else int(num_steps)
        check_filter(names_filter, list(self._hook_points))
        wanted = name_matcher(names_filter)
        cache = ActivationCache()

        def store(x: torch.Tensor, point: HookPoint, step: int | None) -> None:
            x = x.detach()
            if not point.iterated:
                cache[point.name] = x.to(
                    device=cache_device or x.device, dtype=cache_dtype or x.dtype
                )
                return
            first = hook_names.first_step(point.name)  # 0 for s_0 … s_r, else 1 … r
            if point.name not in cache:
                cache[point.name] = torch.empty(
                    (steps + 1 - first, *x.shape),
                    device=cache_device or x.device,
                    dtype=cache_dtype or x.dtype,
                )
            cache[point.name][step - first].copy_(x)

        recorders = [
            (name, lambda x, hook, p=point: store(x, p, hook.step))
            for name, point in self._hook_points.items()
            if wanted(name)
        ]
        with self.hooks(recorders):
            output = self.forward(
                input_ids, num_steps=steps, init_state=init_state, **forward_kwargs
            )
        return output, cache
