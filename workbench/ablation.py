"""Direction and rotation-plane ablation over depth, with random subspaces of the same size as control.

A token's rotation plane (the plane `classify_dynamics` fits to its orbit) is projected out of its
state at every iteration: s ← s − (s Qᵀ) Q, Q the orthonormal basis. Whether that matters is judged
against K random subspaces of the same dimension ablated the same way: the real plane's effect, the
control's mean and spread, and the real effect's percentile among the random ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from recurrent_model.hook_names import STATE

from .dynamics import rotation_plane
from .interventions_common import (
    encode_prompt,
    hook_steps,
    is_active,
    orthonormal_rows,
    position_mask,
    run_init,
    step_range,
)
from .steering import Prompt


def project_out_hook(
    basis: np.ndarray | torch.Tensor,
    steps: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
):
    """A hook function removing the activation's component in span(basis) at iterations first … last
    (None = every firing) and ``positions`` (None = all).

    ``basis`` (k, h) is orthonormalised here; a batch of bases (B, k, h), already orthonormal, gives
    each batch row its own subspace (the random controls run as one batched forward).
    """
    steps = step_range(steps)
    b = torch.as_tensor(np.asarray(basis) if isinstance(basis, np.ndarray) else basis)
    q = orthonormal_rows(b) if b.dim() <= 2 else b.double()

    def fn(x: torch.Tensor, hook) -> torch.Tensor | None:
        if not is_active(hook, steps):
            return None
        qd = q.to(device=x.device, dtype=x.dtype)
        if qd.dim() == 2:
            out = x - (x @ qd.T) @ qd
        else:
            if qd.shape[0] != x.shape[0]:
                raise ValueError(f"{qd.shape[0]} bases for a batch of {x.shape[0]} rows")
            out = x - torch.einsum("btk,bkh->bth", torch.einsum("bth,bkh->btk", x, qd), qd)
        mask = position_mask(positions, x)
        return out if mask is None else torch.where(mask, out, x)

    return fn


def random_bases(n: int, k: int, h: int, seed: int = 0) -> torch.Tensor:
    """``n`` random orthonormal k-dimensional bases of R^h (uniform on the Grassmannian), (n, k, h)."""
    gen = torch.Generator().manual_seed(int(seed))
    g = torch.randn(n, h, k, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(g)
    return q.transpose(1, 2).contiguous()


def token_rotation_plane(
    model,
    input_ids: Prompt,
    num_steps: int,
    position: int,
    *,
    tail: int | None = None,
    init_scale: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """The rotation plane (2, h) of one token's raw core states s_0 … s_r, as `classify_dynamics`
    fits it (the space the ablation acts in: raw states, not ln_f-normalised latents)."""
    ids = encode_prompt(model, input_ids).to(model.device)
    init = run_init(model, ids.shape[1], init_scale, seed, 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, num_steps=num_steps, names_filter=STATE, **init)
    traj = cache[STATE][:, 0, position].double().cpu().numpy()
    return rotation_plane(traj, tail=tail)


FROM_TOKEN_MEASURE = (
    "mean over positions p … T−1 (p the ablated token) of KL(baseline ‖ ablated) of the "
    "next-token distributions"
)


@dataclass(frozen=True)
class AblationResult:
    """The ablated subspace's effect and the random-subspace control, in two measures.

    ``effect``: mean over positions p … T−1 (p = ``position``, the ablated token: the positions it
    can influence) of KL(baseline ‖ ablated) of the next-token distributions (``measure`` says so).
    ``control``: the same for each of K random subspaces; ``percentile``: share (%) of random
    subspaces with a smaller effect (ties count half). ``effect_last``, ``control_last`` and
    ``percentile_last``: the same at the last position only, the measure of `SteeringEffect.kl`.
    ``table``: one row per ablation (``kind`` "real" or "random") with ``effect``, ``kl_last`` and
    ``logprob_change`` (of the baseline's top token at the last position).
    """

    effect: float
    control: np.ndarray
    percentile: float
    table: pd.DataFrame
    position: int
    measure: str = FROM_TOKEN_MEASURE

    @property
    def control_mean(self) -> float:
        return float(np.mean(self.control))

    @property
    def control_std(self) -> float:
        return float(np.std(self.control, ddof=1)) if self.control.size > 1 else float("nan")

    @property
    def effect_last(self) -> float:
        return float(self.table.kl_last.iloc[0])

    @property
    def control_last(self) -> np.ndarray:
        return self.table.kl_last.iloc[1:].to_numpy()

    @property
    def percentile_last(self) -> float:
        return _percentile(self.effect_last, self.control_last)


def _percentile(value: float, control: np.ndarray) -> float:
    """Share (%) of ``control`` below ``value``, ties counting half."""
    below = np.sum(control < value) + 0.5 * np.sum(control == value)
    return float(100.0 * below / control.size)


def _with_random_bases(model, basis, n_random: int, seed: int) -> torch.Tensor:
    """(1 + n_random, k, h): ``basis`` orthonormalised, then the random controls of its size."""
    real = orthonormal_rows(basis)
    k, h = real.shape
    if h != model.config.n_embd:
        raise ValueError(f"the basis has size {h}, the hidden size is {model.config.n_embd}")
    return torch.cat([real[None], random_bases(n_random, k, h, seed)])


def _ablation_table(
    model, ids: torch.Tensor, num_steps: int, position: int, bases: torch.Tensor, *, hook: str,
    steps: tuple[int, int] | None, init_scale: float, seed: int, batch_size: int,
    progress: Callable[[int, int], None] | None,
) -> pd.DataFrame:  # fmt: skip
    """One row per basis (the first "real", the rest "random"): the KL and log-probability change
    its ablation causes against the unablated run, ``batch_size`` bases per batched forward."""
    length = ids.shape[1]
    with torch.no_grad():
        init = run_init(model, length, init_scale, seed, 1)
        base = torch.log_softmax(model(ids, num_steps=num_steps, **init).logits[0].float(), -1)
        rows = []
        for start in range(0, len(bases), batch_size):
            if progress is not None:
                progress(start, len(bases))
            chunk = bases[start : start + batch_size]
            fn = project_out_hook(chunk, steps, positions=[position])
            init = run_init(model, length, init_scale, seed, len(chunk))
            with model.hooks([(hook, fn)]):
                logits = model(ids.expand(len(chunk), -1), num_steps=num_steps, **init).logits
            rows += _ablation_rows(base, torch.log_softmax(logits.float(), -1), position, start)
    if progress is not None:
        progress(len(bases), len(bases))
    return pd.DataFrame(rows)


def _ablation_rows(base: torch.Tensor, lp: torch.Tensor, position: int, first: int) -> list[dict]:
    """The table rows of one batch: ablated log-probabilities ``lp`` (B, T, V) against ``base``
    (T, V); ``first`` is the batch's index among all bases (0: the real one)."""
    target = int(base[-1].argmax())
    kl = torch.sum(base.exp() * (base - lp), dim=-1).clamp_min(0.0)  # (B, T)
    return [
        {
            "kind": "real" if first + b == 0 else "random",
            "effect": float(kl[b, position:].mean()),
            "kl_last": float(kl[b, -1]),
            "logprob_change": float(lp[b, -1, target] - base[-1, target]),
        }
        for b in range(len(lp))
    ]


def ablate_subspace(
    model,
    input_ids: Prompt,
    num_steps: int,
    position: int,
    basis: np.ndarray | torch.Tensor | None = None,
    *,
    n_random: int = 32,
    hook: str = STATE,
    steps: tuple[int, int] | None = None,
    init_scale: float = 0.0,
    tail: int | None = None,
    seed: int = 0,
    batch_size: int = 33,
    progress: Callable[[int, int], None] | None = None,
) -> AblationResult:
    """Project ``basis`` (k, h; default: the token's rotation plane) out of ``hook``'s activation at
    ``position`` at every iteration (or iterations ``steps``), and the same for ``n_random`` random
    k-dimensional subspaces (the control). A direction is a basis with k = 1. ``progress(done,
    total)`` (subspaces) is called before every batch and at the end; it may raise to stop."""
    ids = encode_prompt(model, input_ids).to(model.device)
    length = ids.shape[1]
    if not -length <= int(position) < length:
        raise ValueError(f"position {position} is outside the {length} tokens")
    position = int(position) % length
    hook_steps(model, hook, int(num_steps))  # names a missing hook
    if int(n_random) < 2:
        raise ValueError(f"n_random must be >= 2 for a spread, got {n_random}")
    if basis is None:
        basis = token_rotation_plane(
            model, ids, num_steps, position, tail=tail, init_scale=init_scale, seed=seed
        )
    bases = _with_random_bases(model, basis, int(n_random), seed)
    table = _ablation_table(model, ids, num_steps, position, bases, hook=hook, steps=steps,
                            init_scale=init_scale, seed=seed, batch_size=int(batch_size),
                            progress=progress)  # fmt: skip
    effect = float(table.effect[0])
    control = table.effect[1:].to_numpy()
    return AblationResult(effect, control, _percentile(effect, control), table, position)
