"""The diffusion sampler's wavefront as tables: which positions were refined at which sampler step.

``recurrent_model.diffusion.generate_diffusion(..., return_details=True)`` returns per-step tablets;
these functions turn them into long DataFrames for figures and the app.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pandas as pd


class Tablets(Protocol):
    """What the wavefront analysis reads (a ``recurrent_model.diffusion.DiffusionOutput``)."""

    prompt_length: int
    token_tablet: object
    counter_tablet: object
    stability_tablet: object
    frozen_lengths: object
    sequence_lengths: object
    wave_starts: object
    wave_widths: object


def _array(x: object, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {arr.shape}")
    return arr


def wavefront_frame(details: Tablets, include_prompt: bool = False) -> pd.DataFrame:
    """One row per (sampler step, position) the sequence reached at that step.

    Columns: step, position, token (the current guess; frozen tokens are final), recurrence (core
    iterations the position has received so far), stability (steps its guess stayed unchanged),
    frozen (position lies in the frozen prefix), in_wave (the step iterated this position).
    Prompt positions are left out unless ``include_prompt``.
    """
    tokens = _array(details.token_tablet, "token_tablet", 2)
    counter = _array(details.counter_tablet, "counter_tablet", 2)
    stability = _array(details.stability_tablet, "stability_tablet", 2)
    frozen = _array(details.frozen_lengths, "frozen_lengths", 1)
    lengths = _array(details.sequence_lengths, "sequence_lengths", 1)
    starts = _array(details.wave_starts, "wave_starts", 1)
    widths = _array(details.wave_widths, "wave_widths", 1)
    steps = tokens.shape[0]
    if not counter.shape == stability.shape == tokens.shape:
        raise ValueError(
            f"tablets disagree in shape: tokens {tokens.shape}, counter {counter.shape}, "
            f"stability {stability.shape}"
        )
    if not len(frozen) == len(lengths) == len(starts) == len(widths) == steps:
        raise ValueError(f"per-step lengths must have {steps} entries, one per tablet row")
    first = 0 if include_prompt else int(details.prompt_length)
    rows: dict[str, list] = {k: [] for k in ("step", "position", "token", "recurrence",
                                             "stability", "frozen", "in_wave")}  # fmt: skip
    for t in range(steps):
        positions = np.arange(first, int(lengths[t]))
        rows["step"].append(np.full(len(positions), t))
        rows["position"].append(positions)
        rows["token"].append(tokens[t, positions])
        rows["recurrence"].append(counter[t, positions])
        rows["stability"].append(stability[t, positions])
        rows["frozen"].append(positions < frozen[t])
        rows["in_wave"].append((positions >= starts[t]) & (positions < starts[t] + widths[t]))
    frame = pd.DataFrame({k: np.concatenate(v) if v else np.array([], dtype=np.int64)
                          for k, v in rows.items()})  # fmt: skip
    return frame.astype({"frozen": bool, "in_wave": bool})


def frontier_frame(details: Tablets) -> pd.DataFrame:
    """One row per sampler step: frozen_length (tokens frozen incl. the prompt), newly_frozen,
    wave_start / wave_end (the positions iterated, end exclusive) and sequence_length."""
    frozen = _array(details.frozen_lengths, "frozen_lengths", 1).astype(np.int64)
    starts = _array(details.wave_starts, "wave_starts", 1).astype(np.int64)
    widths = _array(details.wave_widths, "wave_widths", 1).astype(np.int64)
    lengths = _array(details.sequence_lengths, "sequence_lengths", 1).astype(np.int64)
    before = (
        np.concatenate([[int(details.prompt_length) + 1], frozen[:-1]]) if len(frozen) else frozen
    )
    return pd.DataFrame({
        "step": np.arange(len(frozen)),
        "frozen_length": frozen,
        "newly_frozen": frozen - before,
        "wave_start": starts,
        "wave_end": starts + widths,
        "sequence_length": lengths,
    })  # fmt: skip
