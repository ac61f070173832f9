"""How ranks share the work: one ``Strategy`` class per way, all in one registry (``REGISTRY``).

A strategy carries everything the trainer, the config validation and the memory plan ask of it:

    shard              FSDP2 ``fully_shard`` of the meta-device model before it is materialised
    wrap               what the training step calls (DDP's wrapper, or the model itself)
    build_optimizer    the optimizer over the parameter groups (ZeRO-1 shards its moments)
    sync_context       around each micro-batch: skip the gradient sync on all but the last one
    after_backward     after the last micro-batch: the recipe's bucketed all-reduce, FSDP's reshard
    shard_counts       for the plan: ranks sharing weights and gradients, ranks sharing the moments
    optimizer_bytes    for the plan: the Adam moments one rank holds
    communication      for the plan: the communication buffers one rank holds

The defaults train the plain model on every rank with nothing sharded and no gradient sync; with one
rank every strategy trains the plain model. The four strategies (``pretrain/distributed.py`` holds
the engines they call):

    ddp       DistributedDataParallel: every rank holds everything (weights, gradients, moments).
    bucketed  the recipe's 64 MiB float32 all-reduce of gradients, with the Adam moments sharded over
              the ranks (ZeRO-1 through ``ZeroRedundancyOptimizer``).
    fsdp      FSDP2 ``fully_shard`` per block and the root over one mesh of all ranks.
    hsdp      FSDP2 on a 2-D mesh (replicate, shard): sharded within a node, replicated across nodes.

To add one: a subclass with a ``name``, overriding what differs, and its class in ``REGISTRY``
(docs/contributing.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from cluster.context import DistContext

from .distributed import (
    BUCKET_BYTES,
    bucketed_all_reduce,
    flat_mesh,
    node_mesh,
    ranks_per_node,
    reshard_core,
    shard_model,
    sharded_optimizer,
)

if TYPE_CHECKING:
    from .plan import ParameterCounts
    from .precision import Precision


class StrategyError(ValueError):
    """An unknown strategy or a shard layout that does not divide the ranks; the message says which."""


class Strategy:
    """One way to share the work; ``shard_size`` and ``bucket_bytes`` come from the distributed
    section of the config (``from_config``)."""

    name: ClassVar[str] = ""
    shards_model: ClassVar[bool] = False  # FSDP2 holds the parameters as shards (with > 1 rank)

    def __init__(self, shard_size: int = 0, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.shard_size = shard_size
        self.bucket_bytes = bucket_bytes

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # The memory plan ----------------------------------------------------------------------------
    def shard_counts(self, nodes: int, gpus_per_node: int) -> tuple[int, int]:
        """(ranks sharing the weights and gradients, ranks sharing the optimizer state)."""
        return 1, 1

    def optimizer_bytes(self, counts: ParameterCounts, opt_shard: int) -> tuple[int, str]:
        """Bytes of float32 Adam moments (m, v) one rank holds, and a note for the plan."""
        note = f"/ {opt_shard} ranks" if opt_shard > 1 else "replicated"
        return -(-8 * counts.total // opt_shard), note

    def communication(self, counts: ParameterCounts) -> tuple[int, str] | None:
        """Bytes of communication buffers per rank with more than one rank, and a note."""
        return None

    # Training -----------------------------------------------------------------------------------
    def shard(self, model: nn.Module, ctx: DistContext, precision: Precision) -> None:
        """Shard the meta-device model in place before it is materialised (a no-op here)."""

    def wrap(self, model: nn.Module, ctx: DistContext) -> nn.Module:
        """What the training step calls: the model itself here."""
        return model

    def build_optimizer(
        self,
        groups: list[dict],
        ctx: DistContext,
        optimizer_class: type[torch.optim.Optimizer],
        **hyper: Any,
    ) -> torch.optim.Optimizer:
        """The optimizer over ``groups``: every rank keeps all moments here."""
        return optimizer_class(groups, **hyper)

    def sync_context(
        self, model: nn.Module, wrapped: nn.Module, ctx: DistContext, last: bool
    ) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward and backward; ``last``: the accumulation's last."""
        return contextlib.nullcontext()

    def after_backward(
        self, model: nn.Module, params: Iterable[nn.Parameter], ctx: DistContext
    ) -> None:
        """After the last micro-batch's backward, before the gradient norm and the update."""


class DDP(Strategy):
    """DistributedDataParallel: everything replicated, gradients all-reduced by DDP's reducer."""

    name = "ddp"

    def communication(self, counts: ParameterCounts) -> tuple[int, str] | None:
        return 4 * counts.total, "DDP reducer buckets: a copy of all grads"

    def wrap(self, model: nn.Module, ctx: DistContext) -> nn.Module:
        if not ctx.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def sync_context(
        self, model: nn.Module, wrapped: nn.Module, ctx: DistContext, last: bool
    ) -> contextlib.AbstractContextManager:
        if ctx.distributed and not last:
            return wrapped.no_sync()  # type: ignore[operator]
        return contextlib.nullcontext()


class Bucketed(Strategy):
    """The recipe's bucketed float32 all-reduce after the backward, with ZeRO-1 sharded moments."""

    name = "bucketed"

    def shard_counts(self, nodes: int, gpus_per_node: int) -> tuple[int, int]:
        return 1, nodes * gpus_per_node

    def optimizer_bytes(self, counts: ParameterCounts, opt_shard: int) -> tuple[int, str]:
        size, note = super().optimizer_bytes(counts, opt_shard)
        if opt_shard > 1:  # ZeroRedundancyOptimizer gives each rank whole tensors
            size = max(size, 8 * counts.largest_tensor)
            note = f"ZeRO-1 over {opt_shard} ranks, whole tensors: at least the largest"
        return size, note

    def communication(self, counts: ParameterCounts) -> tuple[int, str] | None:
        return 2 * self.bucket_bytes, "grad all-reduce + weight gather"

    def build_optimizer(
        self,
        groups: list[dict],
        ctx: DistContext,
        optimizer_class: type[torch.optim.Optimizer],
        **hyper: Any,
    ) -> torch.optim.Optimizer:
        if not ctx.distributed:
            return optimizer_class(groups, **hyper)
        return sharded_optimizer(groups, optimizer_class, **hyper)

    def after_backward(
        self, model: nn.Module, params: Iterable[nn.Parameter], ctx: DistContext
    ) -> None:
        if ctx.distributed:
            bucketed_all_reduce(list(params), ctx.world_size, self.bucket_bytes)


class FSDP(Strategy):
    """FSDP2 over one mesh of all ranks; the core blocks stay gathered for the whole step."""

    name = "fsdp"
    shards_model = True

    def shard_counts(self, nodes: int, gpus_per_node: int) -> tuple[int, int]:
        world = nodes * gpus_per_node
        return world, world

    def communication(self, counts: ParameterCounts) -> tuple[int, str] | None:
        size = 4 * counts.core + 4 * max(counts.largest_block, counts.root)
        return size, "unsharded core grads + fp32 reduce-scatter"

    def mesh(self, ctx: DistContext) -> Any:
        """The DeviceMesh the parameters are sharded over."""
        return flat_mesh(ctx)

    def shard(self, model: nn.Module, ctx: DistContext, precision: Precision) -> None:
        if ctx.distributed:
            shard_model(model, self.mesh(ctx), precision)  # type: ignore[arg-type]

    def sync_context(
        self, model: nn.Module, wrapped: nn.Module, ctx: DistContext, last: bool
    ) -> contextlib.AbstractContextManager:
        if ctx.distributed:
            model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()

    def after_backward(
        self, model: nn.Module, params: Iterable[nn.Parameter], ctx: DistContext
    ) -> None:
        if ctx.distributed:  # the core blocks stayed gathered through the whole recurrence
            reshard_core(model)


class HSDP(FSDP):
    """FSDP2 sharded over the ranks of one node (``shard_size``), replicated across nodes."""

    name = "hsdp"

    def shard_counts(self, nodes: int, gpus_per_node: int) -> tuple[int, int]:
        world, size = nodes * gpus_per_node, self.shard_size or gpus_per_node
        if world % size:
            raise StrategyError(f"hsdp shard groups of {size} ranks do not divide {world} ranks")
        return size, size

    def mesh(self, ctx: DistContext) -> Any:
        return node_mesh(ctx, ranks_per_node(ctx, self.shard_size))


REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (DDP, Bucketed, FSDP, HSDP)}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Add a strategy class to the registry under its ``name`` (usable as a decorator)."""
    if not cls.name:
        raise StrategyError(f"{cls.__name__} has no name")
    REGISTRY[cls.name] = cls
    return cls


def strategy_names() -> tuple[str, ...]:
    """Every registered strategy, in the plan's order (least sharded first)."""
    return tuple(REGISTRY)


def get_strategy(name: str, shard_size: int = 0, bucket_bytes: int = BUCKET_BYTES) -> Strategy:
    """The strategy registered as ``name``."""
    try:
        cls = REGISTRY[name]
    except (KeyError, TypeError):
        raise StrategyError(
            f"unknown strategy {name!r}; choose from {', '.join(strategy_names())}"
        ) from None
    return cls(shard_size=shard_size, bucket_bytes=bucket_bytes)


def from_config(section: Any, name: str | None = None) -> Strategy:
    """The strategy of a config's distributed section (``name`` overrides its ``strategy``)."""
    return get_strategy(
        name or section.strategy,
        shard_size=section.shard_size,
        bucket_bytes=int(section.bucket_mb * 1024 * 1024),
    )
