"""What the Compare tab computes: the second checkpoint read from its files (family, weights'
bytes from the safetensors headers) before it is loaded, whether two models and the second
trajectory fit in memory, the second model in a slot of its own, the joint PCA of both
trajectories and the comparison of two corpus runs.

The sidebar's model stays in ``compute.model_slot``; the second lives in ``second_slot``, so
opening it never drops the first. Loading the sidebar's own checkpoint again takes the first
model itself (no second copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st
import torch

import recurrent_model
import workbench
from recurrent_model.checkpoint import (
    TENSOR_DTYPES,
    checkpoint_directory,
    read_config_json,
    read_headers,
    resolve_dtype,
    stored_dtype,
    weight_files,
)
from recurrent_model.families import family_of
from recurrent_model.kv_cache import available_memory
from workbench import corpus

from . import compute
from .cached import cached_analysis, with_key
from .compute import ModelSlot, checkpoint_signature
from .cost import format_bytes

#: The share of the free memory a second model and its trajectory may take (as
#: ``workbench.collect`` allows a collection).
FIT_SHARE = 0.8
STATE_BYTES = 4  # the trajectory's states are float32, raw and normalised


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read from its files, not loaded: where it is, its family, the hidden size,
    the dtype asked for (None: its own) and the bytes its weights take in it."""

    path: str
    directory: Path
    family: str
    hidden_size: int
    dtype_choice: str | None
    dtype: torch.dtype
    weight_bytes: int

    def key(self, device: str) -> str:
        """The model's cache key as ``compute.load`` writes it (path, device, dtype, signature)."""
        return f"{self.path}|{device}|{self.dtype_choice}|{checkpoint_signature(Path(self.path))}"


def read_checkpoint(path: Path, dtype: str | None) -> Checkpoint:
    """The checkpoint at ``path`` (a hub id is fetched) as its files describe it: CheckpointError
    or ConfigError naming the problem when it is not one."""
    directory, _label = checkpoint_directory(path)
    raw = read_config_json(directory)
    family = family_of(raw)
    headers = read_headers(directory, weight_files(directory))
    target = resolve_dtype(dtype) if dtype else stored_dtype(raw, headers)
    total = 0
    for header in headers.values():
        numel = int(np.prod(header.shape, dtype=np.int64))
        size = target.itemsize if header.dtype in TENSOR_DTYPES else _stored_itemsize(header.dtype)
        total += numel * size
    hidden = int(raw.get("n_embd") or raw.get("hidden_size") or 0)
    return Checkpoint(str(path), directory, family.name, hidden, dtype, target, total)


def _stored_itemsize(name: str) -> int:
    """Bytes per element of a non-float safetensors dtype ("I64", "U8", "BOOL")."""
    digits = "".join(c for c in name if c.isdigit())
    return max(1, int(digits) // 8) if digits else 1


def trajectory_bytes(runs: int, num_steps: int, tokens: int, hidden_size: int) -> int:
    """Bytes of a collected trajectory: raw and normalised float32 states of every run."""
    return 2 * runs * (num_steps + 1) * tokens * hidden_size * STATE_BYTES


@dataclass(frozen=True)
class MemoryPlan:
    """The memory two models take: the first's weights (measured), the second's (from its
    headers; none more when it is loaded already or is the first) on ``device``, with what is free
    there now (plus a model the second slot would drop to make room), and the second trajectory,
    which is held in host memory, with what is free there."""

    first: int
    second: int
    trajectory: int
    free: int
    host_free: int
    device: str
    second_loaded: bool

    @property
    def on_device(self) -> int:
        """Bytes the second model adds on the device."""
        return 0 if self.second_loaded else self.second

    @property
    def shares_host(self) -> bool:
        """Whether the device's memory is the host's (the CPU; Apple's unified memory)."""
        return torch.device(self.device).type in ("cpu", "mps")

    def problem(self) -> str | None:
        """What does not fit, in words, or None when both fit."""
        budget = lambda free: FIT_SHARE * free  # noqa: E731
        if self.shares_host and self.on_device + self.trajectory > budget(self.free):
            return (
                f"its weights and trajectory need {format_bytes(self.on_device + self.trajectory)}"
                f" beside the first model ({format_bytes(self.first)}), but "
                f"{format_bytes(budget(self.free))} of the {format_bytes(self.free)} free on "
                f"{self.device} may be used"
            )
        if not self.shares_host and self.on_device > budget(self.free):
            return (
                f"its weights need {format_bytes(self.on_device)} on {self.device} beside the "
                f"first model ({format_bytes(self.first)}), but {format_bytes(budget(self.free))} "
                f"of the {format_bytes(self.free)} free there may be used"
            )
        if not self.shares_host and self.trajectory > budget(self.host_free):
            return (
                f"its trajectory needs {format_bytes(self.trajectory)} of host memory, but "
                f"{format_bytes(budget(self.host_free))} of the {format_bytes(self.host_free)} free "
                "may be used"
            )
        return None

    @property
    def fits(self) -> bool:
        return self.problem() is None

    def line(self) -> str:
        """Both models' weights and the second trajectory, and what is free."""
        loaded = " (in memory)" if self.second_loaded else ""
        host = "" if self.shares_host else f", {format_bytes(self.host_free)} of host memory"
        return (
            f"Memory for two models: the first's weights {format_bytes(self.first)} (in memory) + "
            f"the second's {format_bytes(self.second)}{loaded} + its trajectory "
            f"{format_bytes(self.trajectory)}; {format_bytes(self.free)} free on {self.device}"
            f"{host}."
        )

    def refusal(self) -> str:
        return (
            f"The second model does not fit: {self.problem()}; choose a smaller dtype, fewer "
            "steps or a shorter prompt."
        )


@st.cache_resource(show_spinner=False)
def second_slot() -> ModelSlot:
    """The Compare tab's one second model (the sidebar's stays in ``compute.model_slot``)."""
    return ModelSlot()


def memory_plan(first, found: Checkpoint, key: str, trajectory: int, device: str) -> MemoryPlan:
    """How much the second model and its trajectory add beside ``first``, and what is free."""
    slot = second_slot()
    same = key == getattr(first, "cache_key", None)
    loaded = same or slot.key == key
    free = available_memory(device)
    if not loaded and slot.model is not None:
        free += compute.model_bytes(slot.model)  # dropped before the second is read
    host = available_memory("cpu")
    return MemoryPlan(
        compute.model_bytes(first), found.weight_bytes, trajectory, free, host, device, loaded
    )


def load_second(found: Checkpoint, device: str, key: str):
    """The second model from ``second_slot`` (read when another was there), keyed like
    ``compute.load``'s."""

    def build():
        with st.spinner(f"Loading the second model ({found.dtype_choice or 'its own dtype'}) …",
                        show_time=True):  # fmt: skip
            return recurrent_model.load_model(found.path, device=device, dtype=found.dtype_choice)

    model = second_slot().get(key, build)
    return with_key(model, key)


@cached_analysis(keyed=("traj_a", "traj_b"), max_entries=8)
def joint_pca(traj_a, traj_b) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """PC1 and PC2 of both first runs' states, from one PCA fitted on both together:
    coordinates (steps + 1, T, 2) of each and the explained variance ratios. Models of other
    hidden sizes have no common space: each gets its own PCA and the ratios are None."""
    a, b = traj_a.states[0], traj_b.states[0]
    if a.shape[-1] != b.shape[-1]:
        return workbench.project(a, "pca", 2)[0], workbench.project(b, "pca", 2)[0], None
    h = a.shape[-1]
    both = np.concatenate([a.reshape(-1, h), b.reshape(-1, h)])
    coords, model = workbench.project(both, "pca", n_components=2)
    split = a.shape[0] * a.shape[1]
    return (
        coords[:split].reshape(*a.shape[:2], 2),
        coords[split:].reshape(*b.shape[:2], 2),
        np.asarray(model.explained_variance_ratio_),
    )


def pca_frame(coords: np.ndarray, tokens: list[str], model: str) -> pd.DataFrame:
    """A trajectory's PC coordinates as a long frame: model, step, position, token, pc1, pc2."""
    steps, positions = np.meshgrid(
        np.arange(coords.shape[0]), np.arange(coords.shape[1]), indexing="ij"
    )
    return pd.DataFrame({
        "model": model, "step": steps.ravel(), "position": positions.ravel(),
        "token": np.asarray(tokens, dtype=object)[positions.ravel()],
        "pc1": coords[..., 0].ravel(), "pc2": coords[..., 1].ravel(),
    })  # fmt: skip


@cached_analysis(keyed=("run_a", "run_b"), max_entries=4, show_spinner="Comparing the runs …")
def corpus_comparison(run_a, run_b, n_boot: int) -> dict[str, pd.DataFrame]:
    """``workbench.corpus.compare`` of two corpus run directories (``tab_corpus.CorpusDir``)."""
    return corpus.compare([run_a.path, run_b.path], n_boot=n_boot)
