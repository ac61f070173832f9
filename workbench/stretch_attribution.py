"""Where one iteration stretches or shrinks the leading direction: a log-stretch per sub-layer.

A tangent v at s passes the iteration's pieces in turn (the adapter, then each core layer's attention
and MLP, each with its norms); the chain rule splits its log-stretch exactly:
log(‖J v‖/‖v‖) = Σ_sub log(‖J_sub v_in‖/‖v_in‖), v_in being the tangent as it enters that piece.

That *absolute* split depends on the scale of the space between pieces: a piece that multiplies its
output by c, undone by a following norm, gets +log c and the norm −log c, with nothing contracted.
The primary view is therefore *relative*: per piece log((‖δy‖/‖y‖) / (‖δx‖/‖x‖)), the stretch of the
perturbation measured against the state it perturbs, which gives a pure rescaling 0. The two views
differ per piece by log(‖y‖/‖x‖) (``log_scale``); their totals differ by log(‖F(s)‖/‖s‖), which is
≈ 0 on an attractor. Opposite absolute terms are not a cancellation unless the relative terms show
it too. The default direction is the leading Lyapunov vector at the trajectory's end, so the
absolute total is λ_1's stretch in that step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch.func import jvp

import recurrent_model as rm

from .core_map import CoreMap, differentiable_attention, iterate, problems
from .lyapunov import benettin


def sublayer_stretches(
    core: CoreMap, state: torch.Tensor, direction: torch.Tensor, position: int | None
) -> pd.DataFrame:
    """The log-stretch of ``direction`` (the tangent's shape) through each sub-layer at ``state``.

    A token's block (``position`` an int) follows the tangent at that row only: attention is causal,
    so rows before it carry no tangent and rows after it do not feed it.
    """
    if position is None:
        x, v, row = state[None], direction[None], slice(None)
    else:
        position = position % core.shape[0]
        core = core.prefix(position + 1)
        x = state[None, : position + 1]
        v = torch.zeros_like(x)
        v[0, position] = direction
        row = position
    records = []
    with differentiable_attention():
        for sub in core.sublayers():
            y, jv = jvp(sub.apply, (x,), (v,))
            records.append(
                piece_terms(sub.name, sub.hook, x[0, row], y[0, row], v[0, row], jv[0, row])
            )
            x, v = y.detach(), jv.detach()
    frame = pd.DataFrame(records)
    frame.insert(3, "relative_cumulative", frame["relative"].cumsum())
    frame["cumulative"] = frame["log_stretch"].cumsum()
    return frame


def piece_terms(
    name: str, hook: str, x: torch.Tensor, y: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor
) -> dict[str, object]:
    """One piece's terms: ``relative`` log((‖δy‖/‖y‖)/(‖δx‖/‖x‖)), ``log_stretch`` (absolute)
    log(‖δy‖/‖δx‖) and ``log_scale`` log(‖y‖/‖x‖), so that log_stretch = relative + log_scale."""
    norm = lambda t: float(t.double().norm())  # noqa: E731
    stretch = np.log(norm(dy) / norm(dx))
    scale = np.log(norm(y) / norm(x))
    return {"sublayer": name, "hook": hook, "relative": stretch - scale, "log_stretch": stretch,
            "log_scale": scale}  # fmt: skip


def stretch_attribution(
    model: rm.RecurrentLM,
    input_ids: torch.Tensor | Sequence[int],
    *,
    position: int | None = None,
    num_steps: int | None = None,
    init_scale: float = 0.0,
    seed: int = 0,
    state: torch.Tensor | None = None,
    direction: torch.Tensor | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """One iteration's log-stretch of the leading direction split over adapter, attention and MLPs.

    Without ``direction``: a one-vector Benettin run of ``num_steps`` iterations (default: the mean
    recurrence) from s_0 (or from ``state``) gives the point (its last state) and the direction (the
    leading Lyapunov vector there). With ``direction``: at ``state``, or at s_num_steps without it. Columns
    ``sublayer`` (adapter, core.j.attn, core.j.mlp), ``hook`` (the activation the piece produces),
    ``relative`` and ``relative_cumulative`` (the scale-free view, primary), ``log_stretch`` and
    ``cumulative`` (the absolute view), ``log_scale`` (log ‖y‖/‖x‖ of the state through the piece).
    ``attrs["total"]`` is the whole iteration's absolute log-stretch, ``attrs["total_relative"]``
    the relative one (they differ by log ‖F(s)‖/‖s‖).
    ``on_step(step, steps)`` follows the Benettin run (see lyapunov_run).
    """
    if not isinstance(model, rm.RecurrentLM):
        family = getattr(model, "family", type(model).__name__)
        raise TypeError(
            "stretch_attribution splits an iteration into Huginn's adapter and sandwich "
            f"sub-layers; it is not available for the {family} family"
        )
    rows, _ = problems(model, input_ids, state, 0, init_scale, seed)
    if len(rows) != 1:
        raise ValueError(f"stretch_attribution takes one prompt row, got {len(rows)}")
    p = rows[0]
    if position is not None:
        p.map.check_position(position)
    steps = model.config.mean_recurrence if num_steps is None else int(num_steps)
    if direction is None:
        run = benettin(
            p.map, p.start, max(steps, 1), 1, position, warmup=0, seed=seed, on_step=on_step
        )
        point, direction = run.final_state, run.direction
    else:
        point = p.start if state is not None else iterate(p.map, p.start, steps)[-1]
    expected = tuple(point.shape) if position is None else (point.shape[1],)
    direction = torch.as_tensor(direction, dtype=point.dtype)
    if tuple(direction.shape) != expected or not bool(torch.isfinite(direction).all()):
        raise ValueError(
            f"direction must be a finite tensor of shape {expected}, got {tuple(direction.shape)}"
        )
    if float(direction.norm()) == 0.0:
        raise ValueError("direction is zero: a stretch needs a nonzero tangent")
    frame = sublayer_stretches(p.map, point, direction, position)
    frame.attrs["total"] = float(frame["log_stretch"].sum())
    frame.attrs["total_relative"] = float(frame["relative"].sum())
    return frame
