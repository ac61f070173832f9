"""Generated arithmetic: prompts with known answers, the model's greedy answers, and trajectories.

Feeds ``correctness_probe``: which trajectories belong to prompts the model answered correctly?
The problems and the answer check live in the shared ``tasks.arithmetic`` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from tasks.arithmetic import Problem, arithmetic_problems, is_correct

from .collect import collect
from .probes import trajectory_features

__all__ = ["Problem", "arithmetic_dataset", "arithmetic_problems", "is_correct"]


def arithmetic_dataset(
    model: torch.nn.Module,
    problems: Sequence[Problem],
    num_steps: int,
    max_new_tokens: int = 4,
    feature_steps: Sequence[int] = (-1,),
    seed: int = 0,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Answer every problem greedily (KV-cached ``generate``, s_0 seeded by ``seed``), re-run prompt +
    answer with ``collect`` and featurise it.

    Returns (one row per problem: prompt, answer, generated, correct) and features (n, d) from
    ``trajectory_features`` over the last prompt token and the generated tokens.
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("arithmetic_dataset needs a model with a tokenizer")
    rows, features = [], []
    for problem in problems:
        ids = tokenizer.encode(problem.prompt)
        out = model.generate(
            torch.tensor([ids], device=model.device), max_new_tokens, num_steps=num_steps,
            generator=torch.Generator(model.device).manual_seed(seed), stop_tokens=[],
        )  # fmt: skip
        new = out[0, len(ids) :].tolist()
        generated = tokenizer.decode(new)
        traj = collect(model, ids + new, num_steps, seeds=(seed,), progress=False)
        positions = range(len(ids) - 1, len(ids) + len(new))
        features.append(trajectory_features(traj.states[0], positions, feature_steps))
        rows.append(
            {
                "prompt": problem.prompt,
                "answer": problem.answer,
                "generated": generated,
                "correct": is_correct(generated, problem.answer),
            }
        )
    return pd.DataFrame(rows), np.stack(features)
