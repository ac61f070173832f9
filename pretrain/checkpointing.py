"""Training checkpoints through torch.distributed.checkpoint (DCP): every rank writes its own shards,
nothing is gathered on one rank, nothing is pickled, and a run resumes on any number of ranks.

    DIR/checkpoints/step-0000100/
        config.json, tokenizer.json           the Huginn layout: ``recurrent_model.load_model`` opens
        model.safetensors                     this directory: the weights consolidated from the
                                              ranks' shards (large models: an index and
                                              model-0000i-of-0000N.safetensors files of ~1 GiB,
                                              written in parallel by up to N ranks)
        optimizer/shard-0000R-model-00002-of-00002.safetensors
                                              rank R's shards of the Adam moments and step counts
                                              (DCP's Hugging Face layout: safetensors with the
                                              shard offsets in each file's JSON header; file 1 of
                                              each rank held its model shards until consolidation)
        trainer_state.json                    step, counters, schedule, config, world size, every
                                              rank's data position and RNG states
    DIR/checkpoints/latest                    the name of the newest complete checkpoint

DCP's default storage writes its metadata as a pickle; its Hugging Face writer and reader
(``HuggingFaceStorageWriter(save_distributed=True)`` / ``HuggingFaceStorageReader``) keep everything in
safetensors headers, so no file here is ever unpickled. On resume each rank reads only the slices of
its own shards, whatever the number of ranks that wrote them.

A checkpoint is written into a hidden ``.step-NNNNNNN.tmp-*`` directory that all ranks share; rank 0
renames it into place when every rank has finished (``recurrent_model.atomic_io``), and only then
replaces ``latest``, so a kill at any moment (also during an asynchronous save) leaves ``latest``
naming a complete, loadable checkpoint.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from recurrent_model import RecurrentLM
from recurrent_model.atomic_io import atomic_write_text, publish_directory
from recurrent_model.checkpoint import (
    INDEX_FILE,
    SINGLE_FILE,
    TIED_HEAD,
    CheckpointError,
    checked_weight_files,
)

STATE_JSON = "trainer_state.json"
OPTIMIZER_DIR = "optimizer"
LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d{7,})$")
FORMAT_VERSION = 2
CONSOLIDATED_FILE_BYTES = 2**30  # ~1 GiB per consolidated weight file


class ResumeError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says why."""


def step_name(step: int) -> str:
    return f"step-{step:07d}"


# RNG states -------------------------------------------------------------------------------------
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state of this process as JSON: python, numpy, torch CPU, CUDA, named generators."""
    py = random.getstate()
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *[float(x) for x in np_state[2:]]],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available()
        else [],
        "generators": {k: _b64(g.get_state()) for k, g in (generators or {}).items()},
    }
    return state


def restore_rng(
    state: dict[str, Any], generators: dict[str, torch.Generator] | None = None
) -> None:
    """Inverse of ``capture_rng``."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
    for key, gen in (generators or {}).items():
        if key not in state["generators"]:
            raise ResumeError(f"the checkpoint has no state for the RNG {key!r}")
        gen.set_state(_unb64(state["generators"][key]))


# What each rank contributes ---------------------------------------------------------------------
def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (tied parameters once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights by Huginn name, as this rank holds them: FSDP2 DTensor shards or plain
    replicated tensors (DCP writes each replicated tensor once). The tied head is left out."""
    return {k: v for k, v in model.state_dict().items() if k != TIED_HEAD}


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
class CheckpointManager:
    """Writes, finds and prunes ``DIR/checkpoints/step-NNNNNNN`` and the ``latest`` pointer."""

    def __init__(self, root: str | os.PathLike, keep_last: int = 3) -> None:
        self.root = Path(root)
        self.keep_last = max(1, int(keep_last))

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
        """The checkpoint ``latest`` names (None when there is none yet)."""
        pointer = self.root / LATEST
        if not pointer.is_file():
            return None
        name = pointer.read_text(encoding="utf-8").strip()
        path = self.root / name
        if not STEP_DIR.match(name) or not (path / STATE_JSON).is_file():
            raise ResumeError(f"{pointer} names {name!r}, which is not a complete checkpoint")
        return path

    def staging_path(self, step: int) -> Path:
        """A fresh hidden directory to write step ``step`` into (call on one rank, share the name)."""
        return self.root / f".{step_name(step)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def publish(self, staging: Path, step: int) -> Path:
        """Rename a complete staging directory into place, point ``latest`` at it, prune. Rank 0."""
        target = self.path(step)
        publish_directory(staging, target)
        atomic_write_text(self.root / LATEST, target.name + "\n")
        self.prune()
        return target

    def prune(self) -> list[int]:
        """Delete all but the newest ``keep_last`` checkpoints (never the one ``latest`` names),
        and leftovers of interrupted writes."""
        keep_name = (
            (self.root / LATEST).read_text().strip() if (self.root / LATEST).is_file() else ""
        )
        steps = self.steps()
        removed = []
        for step in steps[: max(0, len(steps) - self.keep_last)]:
            if step_name(step) == keep_name:
                continue
            shutil.rmtree(self.path(step), ignore_errors=True)
            removed.append(step)
        for child in self.root.iterdir():
            if child.name.startswith(".step-") and (".tmp-" in child.name or ".old-" in child.name):
                shutil.rmtree(child, ignore_errors=True)
        return removed


# Writing ----------------------------------------------------------------------------------------
MODEL_FILE_INDEX, OPTIMIZER_FILE_INDEX = 1, 2


def write_shards(
    model: dict[str, torch.Tensor],
    optimizer: dict[str, torch.Tensor],
    optimizer_keys: Iterable[str],
    directory: Path,
    process_group: Any = None,
    asynchronous: bool = False,
) -> Any:
    """Every rank writes its own pieces of the model and optimizer tensors (DTensor shards, or
    replicated tensors that DCP writes once) into ``directory`` through DCP's safetensors writer,
    in one DCP save: per rank one file of model shards and one of optimizer shards.
    ``optimizer_keys`` are the optimizer keys of all ranks (ZeRO-1 ranks hold different ones).
    Collective. Returns the future of ``dcp.async_save`` when ``asynchronous``, else None."""
    files = {k: MODEL_FILE_INDEX for k in model}
    files.update({k: OPTIMIZER_FILE_INDEX for k in optimizer_keys})
    writer = dcp.HuggingFaceStorageWriter(
        str(directory), fqn_to_index_mapping=files, save_distributed=True
    )
    tensors = {**model, **optimizer}
    if asynchronous:
        return dcp.async_save(tensors, storage_writer=writer, process_group=process_group)
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
    files = max(1, min(ranks, len(sizes), -(-sum(sizes.values()) // file_bytes)))
    loads = [0] * files
    plan = {}
    for key in sorted(sizes, key=lambda k: -sizes[k]):
        i = loads.index(min(loads))
        plan[key] = i + 1
        loads[i] += sizes[key]
    return plan


def consolidate_model(
    shards: Path, directory: Path, plan: dict[str, int], process_group: Any = None
) -> None:
    """Turn the ranks' model shards into the Huginn layout (index + model-*.safetensors) in
    ``directory``: each rank assembles whole files from slices of the shard files (on the shared
    file system), so no rank gathers the model. Collective."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (
        consolidate_safetensors_files,
        consolidate_safetensors_files_on_every_rank,
    )

    if _single():
        consolidate_safetensors_files(str(shards), str(directory), plan)
    else:
        consolidate_safetensors_files_on_every_rank(
            str(shards), str(directory), plan, process_group=process_group
        )


def keep_optimizer_shards(shards: Path, directory: Path) -> None:
    """After consolidation: drop the model shard files, keep the optimizer's as ``directory``."""
    for path in shards.glob(f"*-model-{MODEL_FILE_INDEX:05d}-of-*.safetensors"):
        path.unlink()
    os.replace(shards, directory)


def single_file_layout(directory: Path, plan: dict[str, int]) -> None:
    """One consolidated file becomes ``model.safetensors`` without an index (the shipped layout)."""
    from torch.distributed.checkpoint._hf_utils import _gen_file_name

    if max(plan.values()) == 1:
        os.replace(directory / _gen_file_name(1, 1), directory / SINGLE_FILE)
        (directory / INDEX_FILE).unlink(missing_ok=True)


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
    if state.get("format_version") != FORMAT_VERSION:
        raise ResumeError(
            f"{path / STATE_JSON} has format_version {state.get('format_version')!r}, "
            f"expected {FORMAT_VERSION}"
        )
    return state


def saved_keys(directory: Path) -> dict[str, tuple[int, ...]]:
    """Key -> full shape of every tensor a DCP safetensors directory holds (headers only)."""
    if not directory.is_dir() or not any(directory.glob("*.safetensors")):
        return {}
    metadata = dcp.HuggingFaceStorageReader(str(directory)).read_metadata()
    return {k: tuple(v.size) for k, v in metadata.state_dict_metadata.items()}


@torch.no_grad()
def load_model_shards(model: nn.Module, path: Path, process_group: Any = None) -> None:
    """Load the checkpoint's weights into ``model`` in place; each rank reads only its shards'
    slices of the consolidated files (names and shapes are checked first)."""
    try:
        with torch.device("meta"):
            reference = RecurrentLM(model.config, init_weights=False)  # type: ignore[arg-type]
        checked_weight_files(path, reference)
    except CheckpointError as exc:
        raise ResumeError(f"cannot resume from {path}: {exc}") from exc
    tensors = model_tensors(model)
    with _quiet_single_process():
        dcp.load(
            tensors,
            storage_reader=dcp.HuggingFaceStorageReader(str(path)),
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
    optimizer shards, in this rank's layout (sharded like the parameter under FSDP2)."""
    directory = path / OPTIMIZER_DIR
    available = saved_keys(directory)
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
    if not available:  # saved before any optimizer step: nothing to load on any rank
        return
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


def rewind_metrics(path: Path, step: int) -> None:
    """Drop metrics lines logged after ``step`` (by a run killed after its last checkpoint)."""
    if not path.is_file():
        return
    kept: Iterable[str] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and _line_step(line) <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def _line_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0
