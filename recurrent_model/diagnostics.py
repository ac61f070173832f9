"""Recurrence-health diagnostics computed on latent states, shared by training telemetry and the
workbench (pretrain and workbench both import this; it imports neither)."""

from __future__ import annotations

import torch


def token_correlation(states: torch.Tensor) -> torch.Tensor:
    """Mean off-diagonal correlation between the token states of one sequence: (..., T, h) -> (...).

    Each token vector is centred on its own mean and normalised, so a pair's entry is their Pearson
    correlation. Collapsed states (all tokens alike) give 1.0, the failure the paper's training-health
    appendix describes; a healthy model stays far below. A zero vector correlates with nothing.
    Computed in the input's floating dtype (float32 at least) in O(T·h) through the sum of unit vectors.
    """
    T = states.shape[-2]
    if T < 2:
        raise ValueError("token correlation needs at least 2 tokens")
    x = states if states.dtype == torch.float64 else states.float()
    centred = x - x.mean(dim=-1, keepdim=True)
    norms = centred.norm(dim=-1, keepdim=True)
    unit = torch.where(norms > 0, centred / norms.clamp_min(torch.finfo(x.dtype).tiny), 0.0)
    total = unit.sum(dim=-2).pow(2).sum(dim=-1)  # sum of all T x T cosines
    diagonal = (norms[..., 0] > 0).sum(dim=-1).to(x.dtype)
    return (total - diagonal) / (T * (T - 1))
