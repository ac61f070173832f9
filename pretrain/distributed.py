"""The engines the strategies of pretrain/strategy.py call (FSDP2 sharding and meshes, the
recipe's bucketed all-reduce, ZeRO-1), and the model built for a strategy (meta device, shard, then
initialise: ``build_model``). Where a rank runs (``DistContext``) is cluster/context.py.

FSDP2 gathers weights and reduces gradients in float32, with matrix products in bf16 under autocast
(pretrain/precision.py says why). The core blocks stay gathered from their first forward in a step
until the optimizer step (``reshard_core``), so the r + k iterations cost one all-gather each instead
of r + k.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from cluster.context import DistContext
from recurrent_model import RecurrentLM
from recurrent_model.families import empty_model

from .init_from import stored_tensors
from .precision import Precision

if TYPE_CHECKING:
    from .strategy import Strategy

BUCKET_BYTES = 64 * 1024 * 1024


def ranks_per_node(ctx: DistContext, configured: int = 0) -> int:
    """The shard-group size of hsdp: ``configured`` when > 0, else the ranks on this node (torchrun's
    LOCAL_WORLD_SIZE or SLURM_NTASKS_PER_NODE)."""
    if configured > 0:
        size = configured
    else:
        raw = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "")
        size = int(raw.split("(")[0]) if raw else ctx.world_size
    if size < 1 or ctx.world_size % size:
        raise ValueError(
            f"hsdp shards over groups of {size} ranks, which does not divide the world size "
            f"{ctx.world_size}; set distributed.shard_size to a divisor"
        )
    return size


def flat_mesh(ctx: DistContext) -> Any:
    """A 1-D DeviceMesh over all ranks (fsdp)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("shard",))


def node_mesh(ctx: DistContext, size: int) -> Any:
    """A 2-D DeviceMesh (replicate, shard) with shard groups of ``size`` ranks (hsdp)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(
        ctx.device.type, (ctx.world_size // size, size), mesh_dim_names=("replicate", "shard")
    )


def shard_model(model: RecurrentLM, mesh: Any, precision: Precision) -> None:
    """FSDP2 ``fully_shard`` per sandwich block, then the root (embedding, adapter, final norm), all
    with the precision's policy (float32 gathers: see pretrain/precision.py). The core blocks keep
    their gathered weights after forward and backward; the trainer calls ``reshard_core`` once per
    step, before the optimizer updates the shards. Works on a meta-device model (shard, then
    materialise and initialise the shards)."""
    from torch.distributed.fsdp import fully_shard

    policy = precision.fsdp_policy()
    t = model.transformer
    for block in [*t.prelude, *t.coda]:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    for block in t.core_block:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        block.set_reshard_after_backward(False)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def build_model(
    config: Any,
    ctx: DistContext,
    precision: Precision,
    strategy: Strategy,
    seed: int,
    activation_checkpointing: bool = False,
    compile_blocks: bool = False,
    init_from: str | None = None,
) -> tuple[nn.Module, nn.Module]:
    """The model of ``config``'s family (recurrent_model.families) and what the step calls
    (``strategy.wrap``: DDP's wrapper, or the model): built on the meta device, sharded by the
    strategy, materialised on this rank's device, then filled shard by shard: with the weights a
    full ``reset_parameters(generator=Generator().manual_seed(seed))`` gives, or with the stored
    weights of the ``init_from`` checkpoint. No rank ever holds the whole model on the host: one
    full-size host tensor at a time, of which it keeps the slice it owns (``get_strategy`` of
    pretrain/strategy.py turns a name into a strategy). Activation checkpointing and compiled
    blocks are Huginn's model's (pretrain/config.py refuses them for another family)."""
    model = empty_model(config)
    if isinstance(model, RecurrentLM):
        model.activation_checkpointing = activation_checkpointing
        if compile_blocks:
            model.compile_blocks()
    strategy.shard(model, ctx, precision)
    materialise(model, ctx.device)
    if init_from is None:
        init_parameters(model, seed)
    else:
        load_parameters(model, init_from)
    return model, strategy.wrap(model, ctx)


def materialise(model: nn.Module, device: torch.device) -> None:
    """Allocate a meta-device model's (local) parameters on ``device``, uninitialised, keeping a
    tied embedding and output head one tensor (``to_empty`` on a plain module unties them)."""
    model.to_empty(device=device)
    tied = model.config.tie_embeddings  # type: ignore[union-attr]
    if tied and model.lm_head.weight is not model.transformer.wte.weight:  # type: ignore[union-attr]
        model.lm_head.weight = model.transformer.wte.weight  # type: ignore[union-attr]


@torch.no_grad()
def load_parameters(model: nn.Module, directory: str) -> None:
    """Fill the (possibly sharded) parameters from a checkpoint's stored tensors (its names and
    shapes were checked with the config: pretrain/init_from.py), one full tensor at a time, each
    cast to the parameter's dtype; RuntimeError naming any parameter it does not store."""
    params = dict(model.named_parameters())  # a tied head appears once, as the embedding
    filled = set()
    for name, full in stored_tensors(directory, set(params)):
        copy_owned_slice(params[name], full.to(params[name].dtype))
        filled.add(name)
    missing = sorted(set(params) - filled)
    if missing:
        raise RuntimeError(f"{directory} stores no {', '.join(missing[:3])}")


class _OneFullTensorAtATime:
    """Stands in for the model inside ``RecurrentLM.reset_parameters``: that method walks
    ``named_parameters()`` in order and fills each in place from one generator. Handing it one
    full-size host buffer per parameter reuses its rule (and its random stream) exactly; after each
    is filled, the slice this rank owns is copied into the real parameter and the buffer dropped."""

    def __init__(self, model: RecurrentLM) -> None:
        self.config = model.config
        self._model = model

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self._model.named_parameters():
            full = torch.empty(tuple(param.shape), dtype=param.dtype)
            yield name, full
            copy_owned_slice(param, full)


@torch.no_grad()
def init_parameters(model: RecurrentLM, seed: int) -> None:
    """The initial weights of ``RecurrentLM.reset_parameters`` with ``Generator().manual_seed(seed)``,
    written into the (possibly sharded) parameters; host memory: the largest single tensor."""
    generator = torch.Generator().manual_seed(seed)
    RecurrentLM.reset_parameters(_OneFullTensorAtATime(model), generator=generator)  # type: ignore[arg-type]


def owned_slice(param: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` (a parameter's global value) that ``param`` holds on this rank: all of
    it for a plain tensor; for a DTensor the ``torch.chunk`` piece of every sharded mesh dimension
    (FSDP2's layout; a rank past the last chunk holds an empty piece)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return full
    piece = full
    for mesh_dim, placement in enumerate(param.placements):
        if not placement.is_shard():
            continue
        dim = placement.dim  # type: ignore[attr-defined]
        chunks = piece.chunk(param.device_mesh.size(mesh_dim), dim=dim)
        index = param.device_mesh.get_local_rank(mesh_dim)
        piece = chunks[index] if index < len(chunks) else piece.narrow(dim, 0, 0)
    return piece


def copy_owned_slice(param: torch.Tensor, full: torch.Tensor) -> None:
    """Write this rank's slice of ``full`` into ``param`` (a plain tensor or a DTensor shard)."""
    local = param.to_local() if hasattr(param, "to_local") else param
    piece = owned_slice(param, full)
    if tuple(local.shape) != tuple(piece.shape):
        raise RuntimeError(
            f"sharded initialisation: this rank holds {tuple(local.shape)} of a parameter of "
            f"shape {tuple(full.shape)}, but its slice is {tuple(piece.shape)}"
        )
    local.copy_(piece)


def reshard_core(model: nn.Module) -> None:
    """Free the core blocks' gathered weights (FSDP2): call once per step after the last backward and
    before the optimizer step, so the next forward gathers the updated shards. A no-op otherwise."""
    for block in model.transformer.core_block:  # type: ignore[attr-defined]
        if hasattr(block, "reshard"):
            block.reshard()


def sharded_optimizer(
    groups: list[dict], optimizer_class: type[torch.optim.Optimizer], **defaults: Any
) -> torch.optim.Optimizer:
    """ZeRO-1 for the bucketed strategy: torch's ZeroRedundancyOptimizer gives each rank a balanced
    share of the parameters; it keeps moments for those only, updates them, and broadcasts them."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **defaults)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose ``state`` holds this rank's moments (ZeRO-1's inner one, or itself)."""
    return getattr(optimizer, "optim", optimizer)


@torch.no_grad()
def bucketed_all_reduce(
    parameters: list[nn.Parameter], world_size: int, bucket_bytes: int = BUCKET_BYTES
) -> int:
    """The recipe's gradient sync: copy gradients into fixed float32 buckets, all-reduce each (sum),
    divide by the world size, copy back. Returns the number of buckets used."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads or world_size == 1:
        return 0
    capacity = max(1, bucket_bytes // 4)
    device = grads[0].device
    bucket = torch.empty(capacity, dtype=torch.float32, device=device)
    n_buckets, pending, used = 0, [], 0

    def flush() -> None:
        nonlocal used, n_buckets
        if not pending:
            return
        view = bucket[:used]
        dist.all_reduce(view, op=dist.ReduceOp.SUM)
        view.div_(world_size)
        offset = 0
        for g in pending:
            n = g.numel()
            g.copy_(view[offset : offset + n].view_as(g))
            offset += n
        pending.clear()
        used = 0
        n_buckets += 1

    for g in grads:
        flat = g.view(-1)  # gradients are contiguous; pieces below write through this view
        n = flat.numel()
        if n > capacity:  # a tensor bigger than a bucket goes alone, in pieces
            flush()
            for start in range(0, n, capacity):
                piece = flat[start : start + capacity]
                bucket[: piece.numel()].copy_(piece)
                view = bucket[: piece.numel()]
                dist.all_reduce(view, op=dist.ReduceOp.SUM)
                piece.copy_(view.div_(world_size))
                n_buckets += 1
            continue
        if used + n > capacity:
            flush()
        bucket[used : used + n].copy_(flat)
        pending.append(g)
        used += n
    flush()
    return n_buckets


@torch.no_grad()
def preflight_all_reduce(ctx: DistContext, max_bytes: int = 128 * 1024 * 1024) -> list[float]:
    """The recipe's start-up check: all-reduces of growing size (4 KiB doubling up to ``max_bytes``)
    over one buffer, so a bad node or link fails (or times out) before training starts. Verifies
    each sum and returns the seconds each size took."""
    if not ctx.distributed:
        return []
    buffer = torch.empty(max(1, max_bytes // 4), dtype=torch.float32, device=ctx.device)
    timings, n = [], 1024
    while True:
        view = buffer[:n]
        view.fill_(1.0)
        start = time.perf_counter()
        dist.all_reduce(view)
        got = float(view[-1])
        timings.append(time.perf_counter() - start)
        if got != ctx.world_size:
            raise RuntimeError(
                f"preflight all-reduce of {4 * n} bytes returned {got} on rank {ctx.rank}, "
                f"expected {ctx.world_size}: a node or link is faulty"
            )
        if n >= buffer.numel():
            return timings
        n = min(2 * n, buffer.numel())
