"""Where a looped model's learned exit sends each token, beside where its state actually converges.

Ouro trains a gate on every loop's state and reads the output from the first loop whose cumulative
exit probability reaches a threshold; whether that loop is where the token's latent state has
settled is an empirical question this frame answers per token. Families without a learned exit
(Huginn, retrofitted models) get the convergence columns and no exit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from recurrent_model.ouro import exit_steps

from .collect import as_token_ids, collect
from .convergence import convergence, steps_to_converge
from .dynamics import classify_dynamics, dynamics_labels


@torch.no_grad()
def exit_and_convergence(
    model: torch.nn.Module,
    input_ids: torch.Tensor | np.ndarray | Sequence[int],
    num_steps: int,
    threshold: float = 0.5,
    eps: float = 1e-2,
) -> pd.DataFrame:
    """One row per token of one run (seed 0) of ``num_steps`` loops: ``position``, ``token``,
    ``kind`` and ``label`` (the dynamics classification, "converging" while not settled),
    ``steps_to_converge`` (the first step from which the normalised state's relative step stays
    below ``eps``; <NA> if never), and for a family with a learned exit ``exit_step`` (the 1-based
    loop whose cumulative exit probability first reaches ``threshold``, the published rule) and
    ``expected_exit`` (the mean loop under the exit distribution); NaN without one.
    ``attrs``: the settings, and ``learned_exit`` (whether the family has one)."""
    ids = as_token_ids(input_ids)
    traj = collect(model, ids[0].tolist(), num_steps, progress=False)
    states = traj.states[0]
    kinds = classify_dynamics(states, tokens=traj.tokens)
    frame = pd.DataFrame({"position": np.arange(len(traj.tokens)), "token": traj.tokens,
                          "kind": kinds["kind"].to_numpy(), "label": dynamics_labels(kinds).to_numpy()})  # fmt: skip
    settled = steps_to_converge(convergence(states), eps)
    frame["steps_to_converge"] = settled["steps_to_converge"].to_numpy()
    pdf = model(ids.to(model.device), num_steps=num_steps).exit_pdf
    if pdf is None:
        frame["exit_step"] = frame["expected_exit"] = np.nan
    else:
        pdf = pdf[0].float().cpu()
        loops = torch.arange(1, num_steps + 1, dtype=pdf.dtype)
        frame["exit_step"] = (exit_steps(pdf, threshold) + 1).numpy()
        frame["expected_exit"] = (pdf * loops).sum(-1).numpy()
    frame.attrs.update(num_steps=num_steps, threshold=threshold, eps=eps,
                       learned_exit=pdf is not None, model=str(model.name))  # fmt: skip
    return frame
