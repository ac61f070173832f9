"""Lenses: decode every latent state into next-token predictions.

coda lens   s_i → ln_f → coda → ln_f → lm_head   (the model's own decoding path)
logit lens  s_i → ln_f → ln_f → lm_head          (the same path with the coda skipped)

The reference ("final") distribution is the model's output: the coda lens on the last state given.
Pass raw states (``Trajectory.raw_states[k]`` or ``collect_sublayers``): both lenses apply ln_f.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ._frames import token_labels
from .collect import token_strings

LENSES = ("coda", "logit")


def lens_logits(model: torch.nn.Module, raw: torch.Tensor, kind: str) -> torch.Tensor:
    """Float32 next-token logits (S, T, V) of raw states (S, T, h) through the chosen lens."""
    if kind == "coda":
        logits, _ = model.coda(raw, model.rope_at(0, raw.shape[1]))
        return logits
    if kind == "logit":
        return _head_without_coda(model, raw)
    raise ValueError(f"lens must be one of {LENSES}, got {kind!r}")


def _head_without_coda(model: torch.nn.Module, raw: torch.Tensor) -> torch.Tensor:
    """The head on a state with the coda's layers skipped, its norms kept: Huginn's
    lm_head(ln_f(ln_f(s))) (ln_f before and after the coda), a retrofitted model's lm_head(ln_f(s)),
    Ouro's lm_head(s) (its state is normed already, and its readout is the head alone)."""
    norm = model.state_norm()
    if norm is None:
        return model.lm_head(raw).float()
    twice = getattr(model, "family", "") == "Huginn"
    return model.lm_head(norm(norm(raw)) if twice else norm(raw)).float()


def _token_strings(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    return np.asarray(token_strings(model, ids.ravel().tolist()), dtype=object).reshape(ids.shape)


def _lens_arrays(
    model: torch.nn.Module,
    states: torch.Tensor,
    kind: str,
    k: int,
    final_logp: torch.Tensor,
    chunk_bytes: int,
) -> dict[str, np.ndarray]:
    """Per (step, position) of ``states`` (S, T, h): the lens's top-``k`` ids and probabilities, and
    the final token's rank and probability, KL(p_final ‖ p_step) and the entropy; steps run in
    chunks of about ``chunk_bytes``."""
    S, T, _ = states.shape
    final_p = final_logp.exp()
    final_tok = final_logp.argmax(-1)  # (T,)
    V = final_logp.shape[-1]
    chunk = max(1, int(chunk_bytes // (T * V * 4 * 3)))
    out = {n: [] for n in ("topk_ids", "topk_probs", "rank", "prob", "kl", "entropy")}
    for start in range(0, S, chunk):
        logp = torch.log_softmax(lens_logits(model, states[start : start + chunk], kind), dim=-1)
        p = logp.exp()
        top = logp.topk(k, dim=-1)
        out["topk_ids"].append(top.indices)
        out["topk_probs"].append(top.values.exp())
        final_logit = logp.gather(-1, final_tok.expand(logp.shape[0], T)[..., None])
        out["rank"].append((logp > final_logit).sum(-1) + 1)
        out["prob"].append(final_logit[..., 0].exp())
        out["kl"].append((final_p * (final_logp - logp)).sum(-1))
        out["entropy"].append(-(p * logp).sum(-1))
    return {n: torch.cat(v).cpu().numpy() for n, v in out.items()}


@torch.no_grad()
def lens(
    model: torch.nn.Module,
    raw_states: np.ndarray,
    kind: str = "coda",
    top_k: int = 5,
    tokens: Sequence[str] | None = None,
    chunk_bytes: int = 2**28,
) -> pd.DataFrame:
    """One row per (position, step): what the lens reads from each state.

    raw_states: (steps + 1, T, h) raw states of one run. Columns: ``top1_token``, ``topk_ids``,
    ``topk_tokens``, ``topk_probs``; ``final_token`` (the model's prediction from the last state),
    its 1-based ``final_rank`` and ``final_prob`` under this step's lens; ``kl_to_final`` =
    KL(p_final ‖ p_step) in nats; ``entropy`` (nats).
    """
    x = np.asarray(raw_states)
    if x.ndim != 3:
        raise ValueError(f"raw_states must be (steps + 1, T, h), got shape {x.shape}")
    S, T, _ = x.shape
    param = next(model.parameters())
    states = torch.from_numpy(np.ascontiguousarray(x)).to(param.device, param.dtype)
    final_logp = torch.log_softmax(lens_logits(model, states[-1:], "coda")[0], dim=-1)  # (T, V)
    final_tok = final_logp.argmax(-1)  # (T,)
    k = min(int(top_k), final_logp.shape[-1])
    arrays = _lens_arrays(model, states, kind, k, final_logp, chunk_bytes)  # (S, T, ...)
    topk_ids = arrays["topk_ids"].transpose(1, 0, 2).reshape(T * S, k)
    topk_tokens = _token_strings(model, topk_ids)
    pos, step = np.meshgrid(np.arange(T), np.arange(S), indexing="ij")
    final_ids = final_tok.cpu().numpy()
    return pd.DataFrame(
        {
            "position": pos.ravel(),
            "token": token_labels(tokens, T)[pos.ravel()],
            "step": step.ravel(),
            "lens": kind,
            "top1_token": topk_tokens[:, 0],
            "topk_ids": list(topk_ids),
            "topk_tokens": list(topk_tokens),
            "topk_probs": list(arrays["topk_probs"].transpose(1, 0, 2).reshape(T * S, k)),
            "final_token": _token_strings(model, final_ids)[pos.ravel()],
            "final_rank": arrays["rank"].T.ravel(),
            "final_prob": arrays["prob"].T.ravel(),
            "kl_to_final": np.clip(arrays["kl"].T.ravel(), 0.0, None),
            "entropy": arrays["entropy"].T.ravel(),
        }
    )


def sublayer_lens(
    model: torch.nn.Module,
    sublayer_states: np.ndarray,
    kind: str = "coda",
    top_k: int = 5,
    tokens: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The lens on every core sub-layer output: rows per (position, step, sublayer).

    sublayer_states: (num_steps, n_core, T, h) from ``collect_sublayers``; step is 1-based, and
    the final distribution is the model's output (the last sub-layer of the last step = s_r).
    """
    x = np.asarray(sublayer_states)
    if x.ndim != 4:
        raise ValueError(f"sublayer_states must be (num_steps, n_core, T, h), got shape {x.shape}")
    n_steps, n_core = x.shape[:2]
    frame = lens(model, x.reshape(n_steps * n_core, *x.shape[2:]), kind, top_k, tokens)
    flat = frame["step"].to_numpy()
    frame["step"] = flat // n_core + 1
    frame.insert(3, "sublayer", flat % n_core)
    return frame
