"""Token correlation per step: the collapse diagnostic of the paper's training-health appendix."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from recurrent_model import diagnostics

from ._frames import as_states


def token_correlation(states: np.ndarray) -> pd.DataFrame:
    """Mean off-diagonal correlation between the token states of each step (one row per step).

    The arithmetic is ``recurrent_model.diagnostics.token_correlation`` (the same number training
    logs), in float64. Collapsed states give 1.0; a healthy model stays far below.
    states: (steps + 1, T, h).
    """
    z = torch.from_numpy(as_states(states).astype(np.float64))
    correlation = diagnostics.token_correlation(z).numpy()
    return pd.DataFrame({"step": np.arange(len(correlation)), "correlation": correlation})
