"""Training checkpoints: the Huginn layout plus the trainer state, written atomically, never pickled.

    DIR/checkpoints/step-0000100/   config.json, model.safetensors, tokenizer.json (Huginn layout)
                                    trainer_state.json         step, counters, schedule, config, every
                                                               rank's data position and RNG states
                                    trainer_state.safetensors  optimizer moments and step counts
    DIR/checkpoints/latest          the name of the newest complete checkpoint

A checkpoint directory appears in one rename when complete (``atomic_directory``); ``latest`` is
replaced (temp file + os.replace) only after that, so a kill at any moment leaves ``latest`` naming a
complete, loadable checkpoint.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from recurrent_model import RecurrentLM, atomic_directory
from recurrent_model.checkpoint import CheckpointError, load_weights_into, write_checkpoint_files

STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
LATEST = "latest"
STEP_DIR = re.compile(r"^step-(\d{7,})$")
FORMAT_VERSION = 1


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


# Optimizer state --------------------------------------------------------------------------------
def _full(t: torch.Tensor) -> torch.Tensor:
    """A sharded DTensor gathered into a plain tensor (a collective under FSDP); others unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: dict[int, str]
) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state keyed ``{param name}.{state key}``, on the CPU."""
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value):
                    out[f"{names[id(p)]}.{key}"] = _full(value).detach().to("cpu").contiguous()
    return out


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: dict[int, str], tensors: dict[str, torch.Tensor]
) -> None:
    """Put saved moments back onto the matching parameters (re-sharding them under FSDP)."""
    used = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            prefix = names[id(p)] + "."
            keys = [k for k in tensors if k.startswith(prefix) and "." not in k[len(prefix) :]]
            if not keys:
                continue
            state = {}
            for key in keys:
                value = tensors[key]
                if value.dim() > 0:
                    value = _like(value, p)
                state[key[len(prefix) :]] = value
                used.add(key)
            optimizer.state[p] = state
    unused = sorted(set(tensors) - used)
    if unused:
        raise ResumeError(f"optimizer state for unknown parameters: {', '.join(unused[:5])}")


def _like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value.to(param.device)


# The checkpoint directory -----------------------------------------------------------------------
class CheckpointManager:
    """Writes, finds, loads and prunes ``DIR/checkpoints/step-NNNNNNN``."""

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

    def write(
        self,
        step: int,
        model: RecurrentLM,
        state: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        write_model: Callable[[RecurrentLM, Path], None] | None = None,
    ) -> Path:
        """Write one complete checkpoint, then point ``latest`` at it, then prune old ones."""
        target = self.path(step)
        with atomic_directory(target) as tmp:
            (write_model or write_checkpoint_files)(model, tmp)
            save_file(tensors, str(tmp / STATE_TENSORS), metadata={"format": "pt"})
            payload = {"format_version": FORMAT_VERSION, **state}
            (tmp / STATE_JSON).write_text(json.dumps(payload) + "\n", encoding="utf-8")
        self._point_latest(target.name)
        self.prune()
        return target

    def _point_latest(self, name: str) -> None:
        pointer = self.root / LATEST
        tmp = self.root / f".{LATEST}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, pointer)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

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


def read_state(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The trainer state (JSON) and optimizer tensors of a checkpoint directory."""
    try:
        state = json.loads((path / STATE_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ResumeError(f"cannot read {path / STATE_JSON}: {exc}") from exc
    if state.get("format_version") != FORMAT_VERSION:
        raise ResumeError(
            f"{path / STATE_JSON} has format_version {state.get('format_version')!r}, "
            f"expected {FORMAT_VERSION}"
        )
    tensors = load_file(str(path / STATE_TENSORS)) if (path / STATE_TENSORS).is_file() else {}
    return state, tensors


def load_weights(model: RecurrentLM, path: Path) -> None:
    """Load a checkpoint's weights into an existing (unwrapped) model, exactly."""
    try:
        load_weights_into(model, path)
    except CheckpointError as exc:
        raise ResumeError(f"cannot resume from {path}: {exc}") from exc


def parameter_names(model: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its first name (tied parameters once)."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def rewind_metrics(path: Path, step: int) -> None:
    """Drop metrics lines logged after ``step`` (by a run killed after its last checkpoint)."""
    if not path.is_file():
        return
    kept: Iterable[str] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and _line_step(line) <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)


def _line_step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0
