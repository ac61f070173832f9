"""The checkpoint cycle of a training run: stage a directory, let every rank write its shards and its
own state (synchronously, or in the background with ``dcp.async_save`` through pinned staging memory
kept across saves), agree that every rank's write succeeded, export the model in the Huginn layout
when the cadence asks for it, publish the directory and ``latest``, and prune old checkpoints in a
background thread. The layout is described in ``pretrain/checkpointing.py``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from cluster.context import DistContext

from .checkpointing import (
    EXPORT_DTYPES,
    SHARDS_DIR,
    STATE_JSON,
    CheckpointDirectory,
    consolidation_plan,
    export_model,
    finish_export,
    model_tensors,
    pinned_stager,
    rank_file,
    write_rank_state,
    write_shards,
    write_state_json,
)
from .integrity import digest_file, nonfinite_tensor, write_manifest

# DCP raises CheckpointException (a BaseException) on every rank when any rank's write failed.
WRITE_ERRORS = (Exception, CheckpointException)


class CheckpointWriteError(RuntimeError):
    """A checkpoint write failed on some rank; the checkpoint was not published."""


class NonFiniteWeightsError(CheckpointWriteError):
    """The weights hold NaN or inf on some rank: the checkpoint was not written."""


@dataclass
class Snapshot:
    """What one checkpoint holds: this rank's tensors and state, and the run's shared state."""

    step: int
    model: nn.Module
    optimizer: dict[str, torch.Tensor]
    rank_state: dict[str, Any]  # this rank's data position and RNG, stored as it is
    state: dict[str, Any]  # the run's counters and config (rank 0 writes it)
    final: bool = False  # the run's last checkpoint: always exported


@dataclass
class _Pending:
    staging: Path
    snapshot: Snapshot
    export: bool
    future: Future | None = None
    error: BaseException | None = field(default=None)
    digests: dict[str, dict[str, Any]] = field(default_factory=dict)  # this rank's files
    shard_digests: dict[str, dict[str, Any]] = field(default_factory=dict)  # filled by DCP


class CheckpointManager:
    """Saves a run's checkpoints into ``directory`` (collective calls: every rank calls each
    method at the same point). ``save`` starts a checkpoint, ``poll`` publishes a background save
    once every rank has finished, ``wait`` finishes it, ``close`` ends the cycle."""

    def __init__(
        self,
        directory: CheckpointDirectory,
        ctx: DistContext,
        *,
        asynchronous: bool = False,
        checkpoint_every: int = 100,
        export_every: int = 1,
        export_dtype: str = "float32",
    ) -> None:
        self.directory, self.ctx = directory, ctx
        self.asynchronous = asynchronous and ctx.distributed
        self.checkpoint_every, self.export_every = checkpoint_every, export_every
        self.export_dtype = EXPORT_DTYPES[export_dtype]
        # Checkpoint collectives get their own group, so a background save never interleaves with
        # the training's collectives.
        self.group = torch.distributed.new_group(backend="gloo") if ctx.distributed else None
        self.stager = pinned_stager() if self.asynchronous else None
        self._pruner = ThreadPoolExecutor(1, "prune") if ctx.is_main else None
        self._pruning: Future | None = None
        self._pending: _Pending | None = None
        self.rank_state_bytes = 0  # this rank's own state file, at the last save

    @property
    def busy(self) -> bool:
        """A save has started and is not published yet."""
        return self._pending is not None

    def exports(self, step: int, final: bool) -> bool:
        """Whether the checkpoint of ``step`` is consolidated into the Huginn layout: the last one,
        and every ``export_every``-th of the cadence (0: the last only)."""
        every = self.export_every * self.checkpoint_every
        return final or (self.export_every > 0 and step % every == 0)

    # Saving ---------------------------------------------------------------------------------------
    def save(self, snapshot: Snapshot) -> Path | None:
        """Write ``snapshot`` as DIR/step-NNNNNNN: every rank its own shards and state file. The
        directory appears, and ``latest`` names it, once every rank's write succeeded. Returns the
        path when written synchronously (else None; ``poll``/``wait`` publish it)."""
        self.wait()
        self._check_finite(snapshot)
        staging = self.shared(
            self.directory.staging_path(snapshot.step) if self.ctx.is_main else None
        )
        pending = _Pending(staging, snapshot, self.exports(snapshot.step, snapshot.final))
        if self.ctx.is_main:  # a failure is agreed with the ranks' own writes, below
            pending.error = _attempt(_write_model_files, staging, snapshot.model, pending.digests)
        self.ctx.barrier()
        try:
            self.rank_state_bytes = write_rank_state(staging, self.ctx.rank, snapshot.rank_state)
            name = rank_file(staging, self.ctx.rank).relative_to(staging).as_posix()
            pending.digests[name] = digest_file(staging / name)
        except OSError as exc:  # the shards are still written with the others, then all stop
            pending.error = pending.error or exc
        all_keys = sorted(
            {k for keys in self.ctx.all_gather_object(sorted(snapshot.optimizer)) for k in keys}
        )
        snapshot.state["optimizer_tensors"] = len(all_keys)  # a resume checks they are all there
        try:
            pending.future = write_shards(
                model_tensors(snapshot.model),
                snapshot.optimizer,
                all_keys,
                staging / SHARDS_DIR,
                self.group,
                self.asynchronous,
                self.stager,
                pending.shard_digests,
            )
        except WRITE_ERRORS as exc:  # every rank reports, then all stop together
            pending.error = pending.error or exc
        self._pending = pending
        return None if self.asynchronous else self.wait()

    def poll(self) -> Path | None:
        """Publish a background save if every rank has finished writing it (else return None)."""
        if self._pending is None:
            return None
        future = self._pending.future
        if self.ctx.any(future is not None and not future.done()):
            return None
        return self._finish()

    def wait(self) -> Path | None:
        """Finish the save in flight (if any): wait for every rank, then publish it."""
        if self._pending is None:
            return None
        if self._pending.future is not None:
            try:
                self._pending.future.result()
            except WRITE_ERRORS:  # collected by _finish
                pass
        return self._finish()

    def drop_pending(self) -> None:
        """Forget the save in flight without its collectives (a peer is lost): it stays an
        unpublished staging directory, which pruning removes later."""
        if self._pending is not None and self.ctx.is_main:
            self.directory.done_writing(self._pending.staging)
        self._pending = None

    def close(self) -> None:
        """Finish the save in flight, let pruning end, release the staging memory."""
        try:
            self.wait()
        finally:
            if self._pruner is not None:
                self._pruner.shutdown(wait=True)
            if self.stager is not None:
                self.stager.close()

    # Publishing -----------------------------------------------------------------------------------
    def _finish(self) -> Path | None:
        """Every rank's result, agreed over the ranks; export, publish and prune on success. A
        failure of any step on any rank stops every rank with the checkpoint unpublished."""
        pending, self._pending = self._pending, None
        assert pending is not None
        self._agree(pending, pending.error or _future_error(pending.future))
        pending.digests.update({f"{SHARDS_DIR}/{k}": v for k, v in pending.shard_digests.items()})
        snapshot = pending.snapshot
        plan = consolidation_plan(snapshot.model, self.ctx.world_size)
        if pending.export:
            self._agree(pending, _attempt(self._export, pending, plan))
        files = self._gather_digests(pending.digests)
        path: list[Path] = []
        error = _attempt(self._publish, pending, plan, files, path) if self.ctx.is_main else None
        self._agree(pending, error)
        return path[0] if path else None

    def _export(self, pending: _Pending, plan: dict[str, int]) -> None:
        """Every rank: consolidate the Huginn-layout files, checksum the ones this rank wrote."""
        written = export_model(pending.staging, plan, self.export_dtype, self.group)
        for name in written:
            pending.digests[name] = digest_file(pending.staging / name, sync=True)

    def _gather_digests(self, digests: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Every rank's file entries, merged on rank 0 (a gather, not an all-gather: the other
        ranks never hold the whole manifest); an empty dict elsewhere."""
        if not self.ctx.distributed:
            return dict(digests)
        gathered: list[Any] | None = [None] * self.ctx.world_size if self.ctx.is_main else None
        torch.distributed.gather_object(digests, gathered, dst=0, group=self.group)
        return {k: v for part in gathered or [] for k, v in part.items()}

    def _publish(
        self,
        pending: _Pending,
        plan: dict[str, int],
        files: dict[str, dict[str, Any]],
        path: list[Path],
    ) -> None:
        """Rank 0: the export's last file operations, trainer_state.json, the manifest, the
        rename into place, ``latest``; then pruning in the background."""
        staging = pending.staging
        if pending.export:
            finish_export(staging, plan)
            files.update(_exported_entries(staging, plan, files))
        state = {**pending.snapshot.state, "exported": pending.export, "manifest": True}
        write_state_json(staging, state)
        files[STATE_JSON] = digest_file(staging / STATE_JSON)
        write_manifest(staging, files)
        path.append(self.directory.publish(staging, pending.snapshot.step))
        self._prune_in_background()

    def _check_finite(self, snapshot: Snapshot) -> None:
        """Collective: stop every rank before writing when any rank's weights hold NaN or inf."""
        bad = nonfinite_tensor(model_tensors(snapshot.model))
        reports = [
            f"rank {rank}: {name}"
            for rank, name in enumerate(self.ctx.all_gather_object(bad))
            if name is not None
        ]
        if reports:
            latest = self.directory.latest_name()
            raise NonFiniteWeightsError(
                f"checkpoint step {snapshot.step} was not written: the weights hold non-finite "
                f"values ({'; '.join(reports)}); latest still names {latest}"
            )

    def _agree(self, pending: _Pending, error: BaseException | None) -> None:
        """Collective: continue when no rank has an error, else stop every rank."""
        reports = [r for r in self.ctx.all_gather_object(_describe(error, self.ctx.rank)) if r]
        if reports:
            self._abandon(pending, error, reports)

    def _abandon(self, pending: _Pending, error: BaseException | None, reports: list[str]) -> None:
        """A failed write: remove its staging directory, stop every rank with one message."""
        if self.ctx.is_main and pending.staging.exists():
            shutil.rmtree(pending.staging, ignore_errors=True)
        if self.ctx.is_main:
            self.directory.done_writing(pending.staging)
        self.ctx.barrier()
        raise CheckpointWriteError(
            f"checkpoint step {pending.snapshot.step} was not published: the write failed "
            f"({'; '.join(dict.fromkeys(reports))}); latest still names "
            f"{self.directory.latest_name()}"
        ) from error

    def _prune_in_background(self) -> None:
        """Old checkpoints are deleted by a background thread (one prune after another), off the
        training's critical path."""
        assert self._pruner is not None
        self._pruning = self._pruner.submit(self.directory.prune)
        self._pruning.add_done_callback(_report_prune_error)

    def shared(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if not self.ctx.distributed:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def _report_prune_error(future: Future) -> None:
    error = future.exception()
    if error is not None:
        print(f"pruning old checkpoints failed: {error!r} (they stay on disk)", flush=True)


def _write_model_files(staging: Path, model: nn.Module, digests: dict[str, dict[str, Any]]) -> None:
    """Rank 0: the staging directory, config.json and tokenizer.json, with their checksums."""
    staging.mkdir(parents=True)
    model.config.to_json(staging / "config.json")  # type: ignore[union-attr]
    names = ["config.json"]
    if getattr(model, "tokenizer", None) is not None:
        model.tokenizer.save(staging / "tokenizer.json")  # type: ignore[union-attr]
        names.append("tokenizer.json")
    for name in names:
        digests[name] = digest_file(staging / name, sync=True)


def _exported_entries(
    staging: Path, plan: dict[str, int], files: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """After ``finish_export``: a single consolidated file goes by ``model.safetensors``; an
    index is checksummed (rank 0 rewrote it)."""
    from torch.distributed.checkpoint._hf_utils import _gen_file_name

    from recurrent_model.checkpoint import INDEX_FILE, SINGLE_FILE

    if max(plan.values()) == 1:
        return {SINGLE_FILE: files.pop(_gen_file_name(1, 1))}
    return {INDEX_FILE: digest_file(staging / INDEX_FILE)}


def _attempt(function: Callable[..., Any], *args: Any) -> BaseException | None:
    """Run ``function``; its exception (or None), to be agreed over the ranks."""
    try:
        function(*args)
    except WRITE_ERRORS as exc:
        return exc
    return None


def _describe(error: BaseException | None, rank: int) -> str | None:
    """One line naming the failed ranks and their errors (DCP's exception lists every rank's)."""
    if error is None:
        return None
    if isinstance(error, CheckpointException):
        failures = []
        for rank, failure in sorted(error.failures.items()):
            cause = failure[0] if isinstance(failure, tuple) else failure
            failures.append(f"rank {rank}: {cause!r}")
        return "; ".join(failures)
    return f"rank {rank}: {error!r}"


def _future_error(future: Future | None) -> BaseException | None:
    if future is None:
        return None
    try:
        future.result()
    except WRITE_ERRORS as exc:  # the write's failure, reported by the caller
        return exc
    return None
