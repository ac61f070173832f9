"""Cached computations behind the Interventions tab: patching, steering and ablation.

Like ``apps.compute``: the model comes in unhashed as ``_model`` with a hashable ``model_key``, every
other argument is hashable, so a rerun that changes nothing recomputes nothing. Each function is one
workbench call (plus the token bookkeeping the tab needs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st
import torch

import workbench
from recurrent_model.hook_names import STATE
from recurrent_model.threads import threads_for

ModelKey = str


def corrupt(token_ids: tuple[int, ...], position: int, token_id: int) -> tuple[int, ...]:
    """The token ids with the one at ``position`` replaced by ``token_id``."""
    ids = list(token_ids)
    ids[position] = int(token_id)
    return tuple(ids)


def one_token(tokenizer, text: str) -> int:
    """The id of ``text`` when it is exactly one token, else a ValueError saying what it became."""
    ids = tokenizer.encode(text, add_bos=False)
    if len(ids) != 1:
        raise ValueError(
            f"{text!r} is {len(ids)} tokens ({tokenizer.token_strings(ids)}); the replacement "
            "must be exactly one token so that the clean and corrupted prompts align"
        )
    return int(ids[0])


@st.cache_data(max_entries=8, show_spinner=False)
def patching(
    _model,
    model_key: ModelKey,
    clean: tuple[int, ...],
    corrupted: tuple[int, ...],
    num_steps: int,
    hook: str,
    positions: str,
    direction: str,
    init_scale: float,
    seed: int,
) -> pd.DataFrame:
    """`workbench.patch_states` over every position (or all at once) and step."""
    with threads_for(_model):
        return workbench.patch_states(
            _model, list(clean), list(corrupted), num_steps, hook=hook, positions=positions,
            direction=direction, init_scale=init_scale, seed=seed,
        )  # fmt: skip


@st.cache_data(max_entries=8, show_spinner=False)
def mean_difference(
    _model,
    model_key: ModelKey,
    prompts_a: tuple[str, ...],
    prompts_b: tuple[str, ...],
    num_steps: int,
) -> np.ndarray:
    """Difference of the mean last-token final states of two prompt sets (s_0 = 0)."""
    with threads_for(_model):
        return workbench.difference_of_means(_model, list(prompts_a), list(prompts_b), num_steps)


@st.cache_data(max_entries=16, show_spinner=False)
def token_plane(
    _model, model_key: ModelKey, token_ids: tuple[int, ...], num_steps: int, position: int
) -> np.ndarray:
    """The rotation plane (2, h) of one token's raw core states (s_0 = 0)."""
    with threads_for(_model):
        return workbench.token_rotation_plane(_model, list(token_ids), num_steps, position)


def _hooks(vector: np.ndarray | None, plane: np.ndarray | None, mode: str, amount: float, steps):
    if mode == "rotate":
        return [(STATE, workbench.rotate_plane_hook(plane, amount, steps))]
    return [(STATE, workbench.add_vector_hook(vector, amount, steps))]


@st.cache_data(max_entries=16, show_spinner=False)
def steering(
    _model,
    model_key: ModelKey,
    token_ids: tuple[int, ...],
    num_steps: int,
    _vector: np.ndarray | None,
    _plane: np.ndarray | None,
    direction_key: str,
    mode: str,
    amount: float,
    steps: tuple[int, int],
) -> dict:
    """Effect on the last position's next-token distribution (and an α sweep when adding)."""
    hooks = _hooks(_vector, _plane, mode, amount, steps)
    with threads_for(_model):
        effect = workbench.steering_effect(_model, list(token_ids), num_steps, hooks)
        sweep = None
        if mode == "add":
            alphas = np.linspace(0.0, amount, 6) if amount else [0.0]
            sweep = workbench.steering_sweep(
                _model, list(token_ids), num_steps, _vector, alphas, steps=steps
            )
    return {"effect": effect, "sweep": sweep}


@st.cache_data(max_entries=8, show_spinner=False)
def steered_text(
    _model,
    model_key: ModelKey,
    token_ids: tuple[int, ...],
    num_steps: int,
    _vector: np.ndarray | None,
    _plane: np.ndarray | None,
    direction_key: str,
    mode: str,
    amount: float,
    steps: tuple[int, int],
    max_new_tokens: int,
) -> tuple[str, str]:
    """Greedy continuations without and with the steering hook active during generation."""
    hooks = _hooks(_vector, _plane, mode, amount, steps)
    with threads_for(_model):
        base, steered = workbench.steered_generation(
            _model, torch.tensor(token_ids), max_new_tokens, num_steps, hooks
        )
    n = len(token_ids)
    tok = _model.tokenizer
    return tok.decode(base[0, n:].tolist()), tok.decode(steered[0, n:].tolist())


@st.cache_data(max_entries=16, show_spinner=False)
def ablation(
    _model,
    model_key: ModelKey,
    token_ids: tuple[int, ...],
    num_steps: int,
    position: int,
    n_random: int,
) -> workbench.AblationResult:
    """The token's rotation plane projected out at every iteration vs ``n_random`` random planes."""
    with threads_for(_model):
        return workbench.ablate_subspace(
            _model, list(token_ids), num_steps, position, n_random=n_random
        )
