"""Trajectory: the latent states s_0 … s_r of one sequence for several runs (seed × init scale).

The raw states are stored once; the ln_f-normalised view z_i = ln_f(s_i) is computed from them with
the model's ln_f weight (saved alongside) by ``recurrent_model.functional.rms_norm``, the function the
model's own ``RMSNorm`` calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from recurrent_model.functional import rms_norm

FORMAT_VERSION = 1


def rms_normalize(raw: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """ln_f applied to ``raw`` (..., h) with the model's own RMSNorm arithmetic (float32 statistics)."""
    x = torch.from_numpy(np.ascontiguousarray(raw))
    return rms_norm(x, torch.from_numpy(weight).to(x.dtype), eps).numpy()


@dataclass(eq=False)
class Trajectory:
    """States of one sequence: ``raw_states`` (n_runs, num_steps + 1, T, h).

    One run per (seed, init scale).

    ``states`` is the default view: ln_f-normalised when ``normalized`` is true, raw otherwise.
    ``seeds[k]`` and ``init_scales[k]`` describe run k (axis 0 of every state array).
    ``norm_weight`` None: the family's states are outputs of its norm already (Ouro), so the
    normalised view is the raw states.
    """

    raw_states: np.ndarray
    token_ids: np.ndarray
    tokens: list[str]
    seeds: tuple[int, ...]
    init_scales: tuple[float, ...]
    model_name: str
    norm_weight: np.ndarray | None
    norm_eps: float
    normalized: bool = True
    _normalized_cache: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.raw_states.ndim != 4:
            raise ValueError(
                "raw_states must be (n_runs, num_steps + 1, T, h), got shape "
                f"{self.raw_states.shape}"
            )
        n_runs, _, T, h = self.raw_states.shape
        if len(self.seeds) != n_runs or len(self.init_scales) != n_runs:
            raise ValueError(
                f"{n_runs} runs but {len(self.seeds)} seeds and {len(self.init_scales)} init scales"
            )
        if len(self.tokens) != T or len(self.token_ids) != T:
            raise ValueError(
                f"{T} positions but {len(self.token_ids)} ids / {len(self.tokens)} tokens"
            )
        if self.norm_weight is not None and self.norm_weight.shape != (h,):
            raise ValueError(f"norm_weight must be ({h},), got {self.norm_weight.shape}")

    # Shapes and views ----------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self.raw_states.shape[1] - 1

    @property
    def n_runs(self) -> int:
        return self.raw_states.shape[0]

    @property
    def n_tokens(self) -> int:
        return self.raw_states.shape[2]

    @property
    def hidden_size(self) -> int:
        return self.raw_states.shape[3]

    @property
    def normalized_states(self) -> np.ndarray:
        """z_i = ln_f(s_i), (n_runs, num_steps + 1, T, h), computed once and kept (the raw
        states for a family whose states are normalised already)."""
        if self.norm_weight is None:
            return self.raw_states
        if self._normalized_cache is None:
            self._normalized_cache = rms_normalize(self.raw_states, self.norm_weight, self.norm_eps)
        return self._normalized_cache

    @property
    def states(self) -> np.ndarray:
        """The default view: normalised unless collected with normalized=False."""
        return self.normalized_states if self.normalized else self.raw_states

    def select(
        self, runs: Sequence[int] | None = None, init_scale: float | None = None
    ) -> Trajectory:
        """The sub-trajectory of the given run indices, or of every run with ``init_scale``."""
        if runs is None:
            runs = range(self.n_runs)
        idx = [k for k in runs if init_scale is None or self.init_scales[k] == init_scale]
        if not idx:
            raise ValueError(f"no run matches init_scale={init_scale}; scales: {self.init_scales}")
        return Trajectory(
            raw_states=self.raw_states[idx],
            token_ids=self.token_ids,
            tokens=list(self.tokens),
            seeds=tuple(self.seeds[k] for k in idx),
            init_scales=tuple(self.init_scales[k] for k in idx),
            model_name=self.model_name,
            norm_weight=self.norm_weight,
            norm_eps=self.norm_eps,
            normalized=self.normalized,
        )

    def to_frame(self, include_states: bool = False) -> pd.DataFrame:
        """Long format: one row per (run, step, position) with seed, init_scale, token and ‖state‖.

        ``include_states`` adds the state vector (of the default view) as columns x0 … x{h−1}.
        """
        n_runs, n_steps, T, h = self.raw_states.shape
        run, step, pos = np.meshgrid(
            np.arange(n_runs), np.arange(n_steps), np.arange(T), indexing="ij"
        )
        run, step, pos = run.ravel(), step.ravel(), pos.ravel()
        flat = self.states.reshape(-1, h)
        frame = pd.DataFrame(
            {
                "run": run,
                "seed": np.asarray(self.seeds)[run],
                "init_scale": np.asarray(self.init_scales)[run],
                "step": step,
                "position": pos,
                "token": np.asarray(self.tokens, dtype=object)[pos],
                "norm": np.linalg.norm(flat.astype(np.float32), axis=-1),
            }
        )
        if include_states:
            values = pd.DataFrame(flat, columns=[f"x{j}" for j in range(h)])
            frame = pd.concat([frame, values], axis=1)
        return frame

    # Persistence ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write a safetensors file (arrays) with the metadata as JSON in its header; no pickle."""
        from safetensors.numpy import save_file

        meta = {
            "format_version": FORMAT_VERSION,
            "tokens": list(self.tokens),
            "seeds": [int(s) for s in self.seeds],
            "init_scales": [float(s) for s in self.init_scales],
            "model_name": self.model_name,
            "norm_eps": float(self.norm_eps),
            "normalized": bool(self.normalized),
        }
        tensors = {
            "raw_states": np.ascontiguousarray(self.raw_states),
            "token_ids": np.ascontiguousarray(self.token_ids),
        }
        if self.norm_weight is not None:
            tensors["norm_weight"] = np.ascontiguousarray(self.norm_weight)
        save_file(tensors, str(path), metadata={"workbench.trajectory": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        """Read a file written by ``save``."""
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            header = (f.metadata() or {}).get("workbench.trajectory")
            if header is None:
                raise ValueError(f"{path} is not a workbench trajectory (no trajectory metadata)")
            meta = json.loads(header)
            arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open API
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path} has trajectory format {meta.get('format_version')}, "
                f"this workbench reads {FORMAT_VERSION}"
            )
        return cls(
            raw_states=arrays["raw_states"],
            token_ids=arrays["token_ids"],
            tokens=list(meta["tokens"]),
            seeds=tuple(meta["seeds"]),
            init_scales=tuple(meta["init_scales"]),
            model_name=meta["model_name"],
            norm_weight=arrays.get("norm_weight"),
            norm_eps=meta["norm_eps"],
            normalized=meta["normalized"],
        )
