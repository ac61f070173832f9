"""Where this process sits among the ranks: its rank, local rank and world size (from torchrun's
variables, or SLURM's), its device (a GPU by LOCAL_RANK, or the CPU), and the process group
(gloo on the CPU, nccl / RCCL on GPUs) with the collectives every multi-rank program needs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .flight_recorder import enable_flight_recorder
from .slurm import set_torch_env_from_slurm, under_slurm


@dataclass
class DistContext:
    """Where this process sits: rank, local rank, world size, device and backend."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            if self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index or 0])
            else:
                dist.barrier()

    def all_reduce(self, tensor: torch.Tensor, op: Any = None) -> torch.Tensor:
        """In-place all-reduce (SUM by default) on this rank's device; a no-op in one process."""
        if self.distributed:
            dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True when ``flag`` is set on any rank (used to agree on stopping after a signal)."""
        if not self.distributed:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)


def pick_device(preference: str, local_rank: int) -> torch.device:
    """ "auto": a GPU (CUDA or ROCm) when present, else the CPU. The GPU index is LOCAL_RANK modulo
    the number of visible devices, so one visible device per task (``--gpu-bind=closest``) works."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"the device {preference!r} was asked for, but torch sees no GPU")
        if ":" in preference:
            index = int(preference.split(":")[1])
        else:
            index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(preference)


def init_distributed(
    device_preference: str = "auto", timeout_minutes: int = 30, out: str | Path | None = None
) -> DistContext:
    """Read the rank from torchrun's variables (or SLURM's) and join the process group if > 1 rank,
    with the start-up collective timeout (a trainer may shorten it after its first step). On NCCL
    with ``out``, the flight recorder dumps to OUT/stacks on a timeout (cluster/flight_recorder.py)."""
    if under_slurm() and "RANK" not in os.environ:
        set_torch_env_from_slurm()
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(device_preference, local_rank)
    if world == 1:
        return DistContext(0, 0, 1, device, None)
    backend = "nccl" if device.type == "cuda" else "gloo"  # "nccl" is RCCL on ROCm builds
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"timeout": timedelta(minutes=timeout_minutes)}
        if device.type == "cuda":
            kwargs["device_id"] = device
        if backend == "nccl" and out is not None:
            enable_flight_recorder(out)
        dist.init_process_group(backend=backend, rank=rank, world_size=world, **kwargs)
    return DistContext(rank, local_rank, world, device, backend)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
