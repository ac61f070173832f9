"""Trainer callbacks that multi-rank tests hand to every rank (``launch.py --callback
rank_callbacks:NAME``, with tests/ on PYTHONPATH). Each writes what its rank saw into the run
directory for the test to read."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from pretrain.callbacks import TrainerCallback


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for an FSDP2 DTensor), detached."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()


class StepReport(TrainerCallback):
    """OUT/rank{R}.json at the end of the run: [step index, depth without and with gradient] per
    step, the sha1 of every row read, the world size and the sha1 of the full parameters."""

    def __init__(self) -> None:
        self.depths: list[list[int]] = []
        self.rows: list[str] = []

    def on_batch(self, trainer: Any, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.rows.extend(hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in inputs)

    def on_step_end(self, trainer: Any, record: dict[str, Any]) -> None:
        self.depths.append([record["step"] - 1, record["depth_no_grad"], record["depth_grad"]])

    def on_run_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        flat = torch.cat([full(p).reshape(-1) for p in trainer.model.parameters()])
        report = {
            "depths": self.depths,
            "rows": self.rows,
            "world": trainer.ctx.world_size,
            "params": hashlib.sha1(flat.numpy().tobytes()).hexdigest(),
        }
        path = trainer.out / f"rank{trainer.ctx.rank}.json"
        path.write_text(json.dumps(report), encoding="utf-8")


GATHERS: dict[str, int] = {}  # FSDP2 all-gathers per module since the step began


class CheckpointReport(TrainerCallback):
    """Rank 0 writes the full weights and optimizer state at the start of the run (right after a
    resume) and at its end, and OUT/gathers.json: each step's depth and FSDP2 all-gathers per
    module. With HOLD_AT_STEP=N every rank touches OUT/reached{R} before step N + 1 and waits for
    OUT/go."""

    def __init__(self) -> None:
        self.steps: list[dict[str, int]] = []
        self.hold = int(os.environ.get("HOLD_AT_STEP", "-1"))

    def dump(self, trainer: Any, tag: str) -> None:
        from pretrain.distributed import local_optimizer

        state = trainer.model.state_dict()
        params = {k: full(v).clone() for k, v in state.items() if k != "lm_head.weight"}
        optim = {}
        for p, moments in local_optimizer(trainer.optimizer).state.items():
            for key, value in moments.items():
                optim[f"{trainer.names[id(p)]}.{key}"] = full(value).clone()
        if trainer.ctx.rank == 0:
            save_file(params, str(trainer.out / f"{tag}_params.safetensors"))
            save_file(optim, str(trainer.out / f"{tag}_optim.safetensors"))

    def on_run_start(self, trainer: Any) -> None:
        self.dump(trainer, "start")

    def on_step_start(self, trainer: Any) -> None:
        if trainer.step == self.hold:
            (trainer.out / f"reached{trainer.ctx.rank}").touch()
            while not (trainer.out / "go").exists():
                time.sleep(0.01)
        GATHERS.clear()

    def on_step_end(self, trainer: Any, record: dict[str, Any]) -> None:
        self.steps.append({"depth": record["depth_no_grad"] + record["depth_grad"], **GATHERS})

    def on_run_end(self, trainer: Any, summary: dict[str, Any]) -> None:
        self.dump(trainer, "end")
        if trainer.ctx.rank == 0:
            (trainer.out / "gathers.json").write_text(json.dumps(self.steps), encoding="utf-8")


def checkpoint_report() -> CheckpointReport:
    """``CheckpointReport`` with this rank's torch instrumentation installed (``instrument``)."""
    instrument(Path(os.environ["DCP_TEST_OUT"]), os.environ["RANK"])
    return CheckpointReport()


def instrument(out: Path, rank: str) -> None:
    """Count FSDP2's all-gathers into ``GATHERS``; record the stager of each asynchronous save
    (OUT/stagers{R}) and the DDP modules alive when the process group goes (OUT/live_ddp{R}); with
    SLOW_CHECKPOINT / FAIL_CHECKPOINT, stall or fail the checkpoint write whose path holds it (on
    SLOW_RANK / FAIL_RANK)."""
    count_gathers()
    record_stagers(out / f"stagers{rank}")
    count_live_ddp_at_shutdown(out / f"live_ddp{rank}")
    if os.environ.get("HOLD_AT_STEP"):
        (out / f"pid{rank}").write_text(str(os.getpid()))
    slow, fail = os.environ.get("SLOW_CHECKPOINT"), os.environ.get("FAIL_CHECKPOINT")
    if slow:  # torchrun starts ranks in their own sessions: the test kills them by pid
        Path(os.environ["SLOW_MARKER"] + ".pid" + rank).write_text(str(os.getpid()))
    if slow or fail:
        stall_or_fail_writes(rank, slow, fail)


def count_gathers() -> None:
    """Count each FSDP param group's all-gathers (those that start one) into ``GATHERS``."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    unshard = FSDPParamGroup.unshard

    def counting_unshard(self: Any, async_op: bool = False) -> Any:
        before = self._all_gather_result
        out = unshard(self, async_op)
        if before is None and self._all_gather_result is not None:
            GATHERS[self._module_fqn] = GATHERS.get(self._module_fqn, 0) + 1
        return out

    FSDPParamGroup.unshard = counting_unshard


def record_stagers(path: Path) -> None:
    """Append the id and type of each asynchronous save's stager to ``path``."""
    import pretrain.checkpointing as ck

    async_save = ck.dcp.async_save

    def recording_async_save(*args: Any, **kwargs: Any) -> Any:
        stager = kwargs.get("async_stager")
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{id(stager)} {type(stager).__name__}\n")
        return async_save(*args, **kwargs)

    ck.dcp.async_save = recording_async_save


def count_live_ddp_at_shutdown(path: Path) -> None:
    """Write the number of live DistributedDataParallel modules to ``path`` at shutdown."""
    from torch.nn.parallel import DistributedDataParallel

    import cluster.context as context

    shutdown = context.shutdown

    def counting_shutdown() -> None:
        live = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
        path.write_text(str(live))
        shutdown()

    context.shutdown = counting_shutdown


def stall_or_fail_writes(rank: str, slow: str | None, fail: str | None) -> None:
    """Stall the write of a path holding ``slow`` (touching SLOW_MARKER first) on SLOW_RANK (every
    rank when unset), or fail the write of a path holding ``fail`` on FAIL_RANK."""
    import torch.distributed.checkpoint as dcp

    this_rank = os.environ.get("SLOW_RANK", rank) == rank
    write = dcp.HuggingFaceStorageWriter.write_data

    def patched_write(self: Any, plan: Any, planner: Any) -> Any:
        if slow and slow in str(self.path) and this_rank:
            Path(os.environ["SLOW_MARKER"]).touch()
            time.sleep(300)
        if fail and fail in str(self.path) and rank == os.environ["FAIL_RANK"]:
            raise OSError("injected write failure")
        return write(self, plan, planner)

    dcp.HuggingFaceStorageWriter.write_data = patched_write
