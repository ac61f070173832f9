"""Training checkpoints through torch.distributed.checkpoint (DCP): every rank writes its own shards,
nothing is gathered on one rank, nothing is pickled, and a run resumes on any number of ranks.

    DIR/checkpoints/step-0000100/
        config.json, tokenizer.json           the model's config and tokenizer
        trainer_state.json                    step, counters, schedule, config, world size (no
                                              per-rank entries: its size does not grow with ranks)
        ranks/rank-000007.json                rank 7's own data-loader position and RNG states
                                              (each rank writes and reads only its own file)
        shards/shard-0000R-model-0000I-of-00002.safetensors
                                              rank R's shards, file 1 the model weights, file 2
                                              the Adam moments and step counts (DCP's Hugging Face
                                              layout: safetensors with the shard offsets in each
                                              file's JSON header); what a resume reads
        model.safetensors                     exported checkpoints only (every
                                              ``train.export_every`` checkpoints and the last one):
                                              the weights consolidated from the shards into the
                                              Huginn layout, in ``train.export_dtype``, so
                                              ``recurrent_model.load_model`` opens the directory
                                              (large models: an index and
                                              model-0000i-of-0000N.safetensors files of ~1 GiB,
                                              written in parallel by up to N ranks)
    DIR/checkpoints/latest                    the name of the newest complete checkpoint

DCP's default storage writes its metadata as a pickle; its Hugging Face writer and reader
(``HuggingFaceStorageWriter(save_distributed=True)`` / ``HuggingFaceStorageReader``) keep everything in
safetensors headers, so no file here is ever unpickled. On resume each rank reads only the slices of
its own shards, whatever the number of ranks that wrote them. Checkpoints of format 2 (consolidated
weights, ``optimizer/`` shards, every rank's state inside trainer_state.json) still resume.

A checkpoint is written into a hidden ``.step-NNNNNNN.tmp-*`` directory that all ranks share; rank 0
renames it into place when every rank's write succeeded (``recurrent_model.atomic_io``), and only then
replaces ``latest``, so a failed write or a kill at any moment (also during an asynchronous save) leaves
``latest`` naming a complete, loadable checkpoint. ``pretrain/checkpoint_manager.py`` runs that cycle.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from recurrent_model.atomic_io import atomic_write_text, publish_directory
from recurrent_model.checkpoint import (
    INDEX_FILE,
    SINGLE_FILE,
    TIED_HEAD,
    CheckpointError,
    read_config_json,
    read_headers,
    weight_files,
)
from recurrent_model.config import ConfigError
from recurrent_model.families import empty_model, family_config, family_of_config

from .integrity import HashingFileSystem
from .watchdog import PUBLISH_LOCK

STATE_JSON = "trainer_state.json"
SHARDS_DIR = "shards"
RANKS_DIR = "ranks"
OPTIMIZER_DIR = "optimizer"  # format 2: the optimizer shards beside consolidated weights
LATEST = "latest"
REJECTED_DIR = "rejected"  # checkpoints a resume refused, kept for inspection (never pruned)
STEP_DIR = re.compile(r"^step-(\d{7,})$")
FORMAT_VERSION = 3
READABLE_FORMATS = (2, 3)
CONSOLIDATED_FILE_BYTES = 2**30  # ~1 GiB per consolidated weight file
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ResumeError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says why."""


def step_name(step: int) -> str:
    return f"step-{step:07d}"


# RNG states -------------------------------------------------------------------------------------
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng(
    generators: dict[str, torch.Generator] | None = None, device: torch.device | None = None
) -> dict[str, Any]:
    """Every RNG state this rank uses, as JSON: python, numpy, torch CPU, the CUDA generator of the
    rank's own device (not of every visible device: the count changes with ``--gpu-bind``) and
    the named generators with their device type."""
    py = random.getstate()
    np_state = np.random.get_state()
    cuda = None
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        cuda = _b64(torch.cuda.get_rng_state(index))
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *[float(x) for x in np_state[2:]]],
        "torch": _b64(torch.get_rng_state()),
        "cuda_device": cuda,
        "generators": {
            k: {"device": g.device.type, "state": _b64(g.get_state())}
            for k, g in (generators or {}).items()
        },
    }


def restore_rng(
    state: dict[str, Any],
    generators: dict[str, torch.Generator] | None = None,
    device: torch.device | None = None,
) -> list[str]:
    """Inverse of ``capture_rng``: restores every state that applies to this process and returns
    one line per state it could not restore (never applies a state to the wrong device)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), cached))
    torch.set_rng_state(_unb64(state["torch"]))
    notes = _restore_cuda_rng(state, device)
    for key, gen in (generators or {}).items():
        saved = state["generators"].get(key)
        if saved is None:
            raise ResumeError(f"the checkpoint has no state for the RNG {key!r}")
        if isinstance(saved, str):  # format 2: a state without its device type
            saved = {"device": gen.device.type, "state": saved}
        if saved["device"] != gen.device.type:
            notes.append(
                f"RNG {key!r} was saved on {saved['device']} and runs on {gen.device.type}: "
                "not restored (it keeps its seed)"
            )
            continue
        gen.set_state(_unb64(saved["state"]))
    return notes


def _restore_cuda_rng(state: dict[str, Any], device: torch.device | None) -> list[str]:
    on_gpu = device is not None and device.type == "cuda"
    if "cuda_device" in state:
        saved = state["cuda_device"]
        if saved is not None and on_gpu:
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.set_rng_state(_unb64(saved), index)
            return []
        if saved is not None:
            return [
                "the CUDA RNG state was saved on a GPU and this rank runs on the CPU: not restored"
            ]
        return (
            ["no CUDA RNG state was saved (a CPU run): the GPU's RNG keeps its seed"]
            if on_gpu
            else []
        )
    saved_all = state.get("cuda") or []  # format 2: one state per visible device
    if not saved_all:
        return []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(saved_all) == visible:
        torch.cuda.set_rng_state_all([_unb64(s) for s in saved_all])
        return []
    return [
        f"CUDA RNG states of {len(saved_all)} visible device(s) were saved and {visible} are "
        "visible now: not restored (which saved device this rank used is not recorded)"
    ]


# Per-rank state ---------------------------------------------------------------------------------
def rank_file(directory: Path, rank: int) -> Path:
    return directory / RANKS_DIR / f"rank-{rank:06d}.json"


def write_rank_state(directory: Path, rank: int, state: dict[str, Any]) -> int:
    """This rank's own state (data-loader position, RNG) as one small JSON file; returns its bytes."""
    path = rank_file(directory, rank)
    path.parent.mkdir(exist_ok=True)
    text = json.dumps(state, separators=(",", ":")) + "\n"
    atomic_write_text(path, text)
    return len(text.encode("utf-8"))


def read_rank_state(path: Path, rank: int, state: dict[str, Any]) -> dict[str, Any]:
    """Rank ``rank``'s saved state in checkpoint ``path`` (``state``: its trainer_state.json)."""
    if "ranks" in state:  # format 2
        return state["ranks"][rank]
    file = rank_file(path, rank)
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ResumeError(f"cannot read rank {rank}'s state {file}: {exc}") from exc


# What each rank contributes ---------------------------------------------------------------------
def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (tied parameters once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights by name, as this rank holds them: FSDP2 DTensor shards or plain
    replicated tensors (DCP writes each replicated tensor once). A head tied to the embedding is
    left out; an untied one (a converted Llama's) is a weight of its own."""
    tied = getattr(model.config, "tie_embeddings", True)
    return {k: v for k, v in model.state_dict().items() if not (tied and k == TIED_HEAD)}


def optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: dict[int, str]
) -> dict[str, torch.Tensor]:
    """This rank's optimizer state keyed ``{param name}.{state key}``: sharded DTensors under FSDP2,
    the moments of this rank's own parameters under ZeRO-1, everything under DDP."""
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value):
                    out[f"{names[id(p)]}.{key}"] = value
    return out


# The checkpoint directory -----------------------------------------------------------------------
class CheckpointDirectory:
    """Finds, publishes and prunes ``DIR/checkpoints/step-NNNNNNN`` and the ``latest`` pointer."""

    def __init__(self, root: str | os.PathLike, keep_last: int = 3) -> None:
        self.root = Path(root)
        self.keep_last = max(1, int(keep_last))
        self._lock = threading.Lock()
        self._writing: set[str] = set()  # staging directories being written: never pruned

    def path(self, step: int) -> Path:
        return self.root / step_name(step)

    def steps(self) -> list[int]:
        """Steps of the complete checkpoint directories present, ascending."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            m = STEP_DIR.match(child.name)
            if m and child.is_dir() and (child / STATE_JSON).is_file():
                found.append(int(m.group(1)))
        return sorted(found)

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names (None when there is none yet). Without the pointer (a
        kill between the rename into place and the pointer's write) the newest complete
        checkpoint: a directory is renamed into place only once complete."""
        pointer = self.root / LATEST
        if not pointer.is_file():
            steps = self.steps()
            return self.path(steps[-1]) if steps else None
        name = pointer.read_text(encoding="utf-8").strip()
        path = self.root / name
        if not STEP_DIR.match(name) or not (path / STATE_JSON).is_file():
            raise ResumeError(f"{pointer} names {name!r}, which is not a complete checkpoint")
        return path

    def latest_name(self) -> str:
        """The name ``latest`` stands for, for messages (never raises)."""
        try:
            latest = self.latest()
        except ResumeError:
            return "a checkpoint that is not complete"
        return latest.name if latest else "no checkpoint"

    def resume_candidates(self) -> tuple[list[Path], list[str]]:
        """The checkpoints a resume tries, best first: the one ``latest`` names, then the other
        complete ones, newest first; and a note when ``latest`` names no complete checkpoint."""
        notes: list[str] = []
        try:
            first = self.latest()
        except ResumeError as exc:
            first = None
            notes.append(str(exc))
        others = [self.path(step) for step in reversed(self.steps())]
        ordered = ([first] if first else []) + [p for p in others if p != first]
        return ordered, notes

    def reject(self, path: Path, reason: str) -> Path:
        """Move a checkpoint a resume refused to ``rejected/`` with the reason beside it: kept for
        inspection, out of the way of the steps the resumed run writes, never pruned. Rank 0."""
        target = self.root / REJECTED_DIR / f"{path.name}.{uuid.uuid4().hex[:8]}"
        target.parent.mkdir(exist_ok=True)
        os.rename(path, target)
        atomic_write_text(target.with_name(target.name + ".why.txt"), reason + "\n")
        return target

    def staging_path(self, step: int) -> Path:
        """A fresh hidden directory to write step ``step`` into (call on one rank, share the name);
        pruning leaves it alone until ``done_writing``."""
        path = self.root / f".{step_name(step)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self._writing.add(path.name)
        return path

    def done_writing(self, staging: Path) -> None:
        with self._lock:
            self._writing.discard(staging.name)

    def publish(self, staging: Path, step: int) -> Path:
        """Rename a complete staging directory into place and point ``latest`` at it. Rank 0;
        the files were synced by the ranks that wrote them, so only the directories are."""
        target = self.path(step)
        with PUBLISH_LOCK:  # a forced exit after SIGTERM waits for the publish to end
            publish_directory(staging, target, fsync_files=False)  # each writer synced its files
            atomic_write_text(self.root / LATEST, target.name + "\n")
        self.done_writing(staging)
        return target

    def prune(self) -> list[int]:
        """Delete all but the newest ``keep_last`` checkpoints (never the one ``latest`` names,
        nor the newest exported one, which ``load_model`` opens), and leftovers of interrupted
        writes (never a staging directory being written)."""
        pointer = self.root / LATEST
        keep_name = pointer.read_text().strip() if pointer.is_file() else ""
        steps = self.steps()
        exported = [step for step in steps if is_exported(self.path(step))]
        removed = []
        for step in steps[: max(0, len(steps) - self.keep_last)]:
            if step_name(step) == keep_name or (exported and step == exported[-1]):
                continue
            shutil.rmtree(self.path(step), ignore_errors=True)
            removed.append(step)
        for child in self.root.iterdir():
            leftover = child.name.startswith(".step-") and (
                ".tmp-" in child.name or ".old-" in child.name
            )
            with self._lock:
                busy = child.name in self._writing
            if leftover and not busy:
                shutil.rmtree(child, ignore_errors=True)
        return removed


# Writing ----------------------------------------------------------------------------------------
MODEL_FILE_INDEX, OPTIMIZER_FILE_INDEX = 1, 2


def pinned_stager() -> Any:
    """DCP's stager for ``async_save``, kept across saves: it copies the tensors into CPU memory it
    allocates once and reuses (pinned when a GPU is present), so training goes on while the copy
    is written."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    gpu = torch.cuda.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=gpu,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=gpu,
        )
    )


def write_shards(
    model: dict[str, torch.Tensor],
    optimizer: dict[str, torch.Tensor],
    optimizer_keys: Iterable[str],
    directory: Path,
    process_group: Any = None,
    asynchronous: bool = False,
    stager: Any = None,
    digests: dict[str, dict[str, Any]] | None = None,
) -> Any:
    """Every rank writes its own pieces of the model and optimizer tensors (DTensor shards, or
    replicated tensors that DCP writes once) into ``directory`` through DCP's safetensors writer,
    in one DCP save: per rank one file of model shards and one of optimizer shards.
    ``optimizer_keys`` are the optimizer keys of all ranks (ZeRO-1 ranks hold different ones).
    ``digests`` (file name -> size and checksum) is filled as this rank's files are written.
    Collective. Returns the future of ``dcp.async_save`` when ``asynchronous`` (staged through
    ``stager``), else None."""
    files = {k: MODEL_FILE_INDEX for k in model}
    files.update({k: OPTIMIZER_FILE_INDEX for k in optimizer_keys})
    writer = dcp.HuggingFaceStorageWriter(
        str(directory), fqn_to_index_mapping=files, save_distributed=True
    )
    if digests is not None:
        writer.fs = HashingFileSystem(digests)
    tensors = {**model, **optimizer}
    if asynchronous:
        return dcp.async_save(
            tensors, storage_writer=writer, process_group=process_group, async_stager=stager
        )
    with _quiet_single_process():
        dcp.save(tensors, storage_writer=writer, process_group=process_group, no_dist=_single())
    return None


def _single() -> bool:
    """One process without a process group: DCP's ``no_dist`` mode (no collectives)."""
    return not (dist.is_available() and dist.is_initialized())


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every call in one process that it assumes one process; that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def consolidation_plan(
    model: nn.Module, ranks: int, file_bytes: int = CONSOLIDATED_FILE_BYTES
) -> dict[str, int]:
    """Huginn name -> output file index (1-based): about ``file_bytes`` per file, at most one file
    per rank (each rank writes its files in parallel), tensors balanced by bytes."""
    sizes = {k: v.numel() * v.element_size() for k, v in model_tensors(model).items()}
    return plan_files(sizes, ranks, file_bytes)


def plan_files(
    sizes: dict[str, int], ranks: int, file_bytes: int = CONSOLIDATED_FILE_BYTES
) -> dict[str, int]:
    """``consolidation_plan`` from tensor name -> bytes."""
    files = max(1, min(ranks, len(sizes), -(-sum(sizes.values()) // file_bytes)))
    loads = [0] * files
    plan = {}
    for key in sorted(sizes, key=lambda k: -sizes[k]):
        i = loads.index(min(loads))
        plan[key] = i + 1
        loads[i] += sizes[key]
    return plan


def export_model(
    checkpoint: Path,
    plan: dict[str, int],
    dtype: torch.dtype = torch.float32,
    process_group: Any = None,
) -> list[str]:
    """Consolidate the model shards of ``checkpoint/shards`` into the Huginn layout in
    ``checkpoint`` (index + model-*.safetensors, or one model.safetensors), each rank assembling
    whole files from slices of the shard files (on the shared file system), so no rank gathers the
    model; then cast the files this rank wrote to ``dtype``. Collective. Returns the names of the
    files this rank wrote."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
        consolidate_safetensors_files_on_every_rank,
    )
    from torch.distributed.checkpoint._hf_utils import _gen_file_name

    shards = checkpoint / SHARDS_DIR
    if _single():
        consolidate_safetensors_files(str(shards), str(checkpoint), plan)
        mine = set(plan.values())
    else:
        consolidate_safetensors_files_on_every_rank(
            str(shards), str(checkpoint), plan, process_group=process_group
        )
        world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        mine = {i for i in set(plan.values()) if i % world == rank}
    if dtype != torch.float32:
        _cast_files(checkpoint, mine, max(plan.values()), dtype)
    return [_gen_file_name(i, max(plan.values())) for i in sorted(mine)]


def _cast_files(directory: Path, indices: Iterable[int], count: int, dtype: torch.dtype) -> None:
    """Rewrite the consolidated files ``indices`` with their floating tensors in ``dtype``."""
    from safetensors.torch import load_file, save_file
    from torch.distributed.checkpoint._hf_utils import _gen_file_name

    for index in indices:
        path = directory / _gen_file_name(index, count)
        tensors = {
            k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(path).items()
        }
        tmp = path.with_name(path.name + ".cast")
        save_file(tensors, tmp)
        os.replace(tmp, path)


def finish_export(directory: Path, plan: dict[str, int]) -> None:
    """After every rank's ``export_model``: one consolidated file becomes ``model.safetensors``
    without an index (the shipped layout); an index gets the files' total size. Rank 0."""
    from torch.distributed.checkpoint._hf_utils import _gen_file_name

    count = max(plan.values())
    if count == 1:
        os.replace(directory / _gen_file_name(1, 1), directory / SINGLE_FILE)
        (directory / INDEX_FILE).unlink(missing_ok=True)
        return
    index = json.loads((directory / INDEX_FILE).read_text())
    files = {directory / _gen_file_name(i, count) for i in range(1, count + 1)}
    index.setdefault("metadata", {})["total_size"] = sum(f.stat().st_size for f in files)
    atomic_write_text(directory / INDEX_FILE, json.dumps(index, indent=2) + "\n")


def consolidate_checkpoint(checkpoint: Path, directory: Path) -> None:
    """A checkpoint that was not exported, as a model directory ``directory`` of its family
    (config.json, tokenizer.json, model.safetensors in float32), in one process."""
    if not (checkpoint / SHARDS_DIR).is_dir():
        raise ResumeError(f"{checkpoint} has neither exported weights nor {SHARDS_DIR}/")
    directory.mkdir(parents=True, exist_ok=True)
    model = empty_model(saved_model_config(checkpoint))
    plan = plan_files({k: 1 for k in model_tensors(model)}, ranks=1)
    for name in ("config.json", "tokenizer.json"):
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, directory / name)
    os.symlink((checkpoint / SHARDS_DIR).resolve(), directory / SHARDS_DIR)
    try:
        with _quiet_single_process():
            export_model(directory, plan)
    finally:
        (directory / SHARDS_DIR).unlink()
    finish_export(directory, plan)


def is_exported(path: Path) -> bool:
    """Whether ``path`` holds Huginn-layout weights (``recurrent_model.load_model`` opens it)."""
    return (path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file()


def write_state_json(directory: Path, state: dict[str, Any]) -> None:
    payload = {"format_version": FORMAT_VERSION, **state}
    atomic_write_text(directory / STATE_JSON, json.dumps(payload) + "\n")


# Reading ----------------------------------------------------------------------------------------
def read_state(path: Path) -> dict[str, Any]:
    """The trainer state (JSON) of a checkpoint directory."""
    try:
        state = json.loads((path / STATE_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ResumeError(f"cannot read {path / STATE_JSON}: {exc}") from exc
    if state.get("format_version") not in READABLE_FORMATS:
        raise ResumeError(
            f"{path / STATE_JSON} has format_version {state.get('format_version')!r}, "
            f"expected one of {READABLE_FORMATS}"
        )
    return state


def saved_keys(directory: Path) -> dict[str, tuple[int, ...]]:
    """Key -> full shape of every tensor a DCP safetensors directory holds (headers only)."""
    if not directory.is_dir() or not any(directory.glob("*.safetensors")):
        return {}
    metadata = dcp.HuggingFaceStorageReader(str(directory)).read_metadata()
    return {k: tuple(v.size) for k, v in metadata.state_dict_metadata.items()}


def _model_source(path: Path) -> Path:
    """Where a resume reads the weights: the shards, or (format 2) the consolidated files."""
    return path / SHARDS_DIR if (path / SHARDS_DIR).is_dir() else path


def _optimizer_source(path: Path) -> Path:
    return path / SHARDS_DIR if (path / SHARDS_DIR).is_dir() else path / OPTIMIZER_DIR


def saved_model_config(checkpoint: Path) -> Any:
    """The config of the model a checkpoint holds (its config.json, read by its family)."""
    try:
        return family_config(read_config_json(checkpoint))[1]
    except (CheckpointError, ConfigError) as exc:
        raise ResumeError(f"cannot read the model config of {checkpoint}: {exc}") from exc


def _check_saved_shapes(source: Path, model: nn.Module) -> None:
    """Every weight of ``model`` is in the shards with its shape (headers only)."""
    reference = empty_model(model.config)
    saved = saved_keys(source)
    for key, tensor in model_tensors(reference).items():
        if key not in saved:
            raise ResumeError(f"cannot resume from {source}: no weight {key}")
        if saved[key] != tuple(tensor.shape):
            raise ResumeError(
                f"cannot resume from {source}: {key} has shape {list(saved[key])}, "
                f"the model {list(tensor.shape)}"
            )


@torch.no_grad()
def load_model_shards(model: nn.Module, path: Path, process_group: Any = None) -> None:
    """Load the checkpoint's weights into ``model`` in place; each rank reads only its shards'
    slices of the saved files (names and shapes are checked first)."""
    source = _model_source(path)
    if source == path:
        try:
            reference = empty_model(model.config)
            module = import_module(f"recurrent_model.{family_of_config(model.config).module}")
            module.check_against_model(path, reference, read_headers(path, weight_files(path)))
        except CheckpointError as exc:
            raise ResumeError(f"cannot resume from {path}: {exc}") from exc
    else:
        _check_saved_shapes(source, model)
    tensors = model_tensors(model)
    with _quiet_single_process():
        dcp.load(
            tensors,
            storage_reader=dcp.HuggingFaceStorageReader(str(source)),
            process_group=process_group,
            no_dist=_single(),
        )


@torch.no_grad()
def load_optimizer_shards(
    optimizer: torch.optim.Optimizer,
    names: dict[int, str],
    path: Path,
    process_group: Any = None,
) -> None:
    """Fill ``optimizer.state`` for the parameters this rank updates from the checkpoint's
    optimizer shards (keys ``{parameter}.{state}``), in this rank's layout (sharded like the
    parameter under FSDP2)."""
    directory = _optimizer_source(path)
    available = saved_keys(directory)  # with the model's keys in format 3: not matched below
    wanted: dict[str, torch.Tensor] = {}
    owners: dict[str, tuple[torch.Tensor, str]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            prefix = names[id(p)] + "."
            for key, shape in available.items():
                if not key.startswith(prefix) or "." in key[len(prefix) :]:
                    continue
                if shape == ():
                    target = torch.zeros((), dtype=torch.float32)
                elif shape == tuple(p.shape):
                    target = torch.zeros_like(p, dtype=torch.float32)
                else:
                    raise ResumeError(
                        f"{directory}: {key} has shape {list(shape)}, but the parameter "
                        f"{names[id(p)]} has {list(p.shape)}"
                    )
                wanted[key] = target
                owners[key] = (p, key[len(prefix) :])
    parameters = set(names.values())
    if not any(key.rsplit(".", 1)[0] in parameters for key in available):
        return  # saved before any optimizer step: nothing to load on any rank
    # Collective: a rank with nothing to read (ZeRO-1 owning no parameter) still takes part.
    with _quiet_single_process():
        dcp.load(
            wanted,
            storage_reader=dcp.HuggingFaceStorageReader(str(directory)),
            process_group=process_group,
            no_dist=_single(),
        )
    for key, value in wanted.items():
        p, state_key = owners[key]
        optimizer.state[p][state_key] = value


class MetricsFileError(RuntimeError):
    """metrics.jsonl cannot be read; the message names the file and the line."""


def read_metrics_lines(path: Path) -> tuple[list[tuple[int, str]], bool]:
    """(step, line) of every record of a metrics file, and whether its last line was torn (a
    write cut short: not JSON, dropped). A damaged line before the last is a MetricsFileError."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MetricsFileError(f"{path} is unreadable: {exc}") from exc
    lines = [line for line in raw.split(b"\n") if line.strip()]
    records, torn = [], False
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line.decode("utf-8"))
            records.append((int(record["step"]), line.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            if number == len(lines) and not raw.endswith(b"\n"):
                torn = True
                continue
            raise MetricsFileError(
                f"{path} line {number} is not a metrics record ({type(exc).__name__}): the file "
                "is damaged; move it aside to resume"
            ) from exc
    return records, torn


def rewind_metrics(path: Path, step: int) -> str | None:
    """Drop metrics lines logged after ``step`` (by a run killed after its last checkpoint) and a
    torn last line; returns a line saying so when a torn line was dropped."""
    if not path.is_file():
        return None
    records, torn = read_metrics_lines(path)
    kept = [line for line_step, line in records if line_step <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))
    if torn:
        return f"{path.name}: its last line was torn (a write cut short): dropped"
    return None
