"""The recipe's optimizer: Adam with update clipping and no ε (atan2 form), after Everett et al. 2024.

Per tensor, with gradient g at step t (1-based):

    first touch:  m = g, v = g²                      (moments start from the first gradient)
    m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²
    rms    = sqrt(mean(g² / max(v, 1e-12)))          (update clipping, with the updated v; the mean is
                                                       a global sum / global numel over all shards)
    lr_eff = lr / max(1, rms)
    θ ← θ·(1 − (lr / lr_peak)·wd)                    (decoupled decay that follows the schedule)
    θ ← θ − lr_eff / (1−β1^t) · atan2(m, sqrt(v / (1−β2^t)))
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

V_FLOOR = 1e-12


class ClippedAtanAdam(torch.optim.Optimizer):
    """Adam-atan2 with update clipping, first-gradient moments and schedule-following weight decay.

    Each param group carries ``lr`` (set by the schedule every step) and ``peak_lr`` (the schedule's
    peak, for the decay factor lr/peak_lr·weight_decay).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        defaults = dict(lr=lr, peak_lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim API
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Pass 1: moments, and each tensor's sum of g²/v over the elements this rank holds.
        work: list[tuple[dict, torch.Tensor, dict]] = []
        sums: list[torch.Tensor] = []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.to(torch.promote_types(p.grad.dtype, torch.float32))
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = g.clone()
                    state["exp_avg_sq"] = g * g
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                sums.append(local_sum(g * g / v.clamp_min(V_FLOOR)))
                work.append((group, p, state))
        # rms = sqrt(global sum / global numel): right for uneven and empty shards, one all-reduce
        # per sharding layout (not per tensor); stays a tensor, so no host sync per parameter.
        sums = reduce_over_shards(sums, [p for _, p, _ in work])
        # Pass 2: the update.
        for (group, p, state), total in zip(work, sums):
            beta1, beta2 = group["betas"]
            lr, peak, wd = group["lr"], group["peak_lr"], group["weight_decay"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            t = float(state["step"])
            rms = (total / p.numel()).sqrt()
            clip = rms.clamp_min(1.0).reciprocal()
            if wd != 0:
                p.mul_(1 - (lr / peak) * wd)
            update = torch.atan2(m, (v / (1 - beta2**t)).sqrt())
            update.mul_(clip * (-lr / (1 - beta1**t)))
            p.add_(update.to(p.dtype))
        return loss


def local_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum (at least float32) of the elements this rank holds (a DTensor's local shard; 0 when
    the shard is empty)."""
    if hasattr(x, "to_local"):
        x = x.to_local()
    return x.sum(dtype=torch.promote_types(x.dtype, torch.float32))


def reduce_over_shards(sums: list[torch.Tensor], params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sum each per-rank partial sum over the ranks its parameter is sharded across.

    Plain tensors are whole on every rank and stay as they are. For a DTensor the sum runs over the
    mesh dimensions with a Shard placement only (HSDP replicas hold the same shard). Partial sums of
    tensors with the same mesh and placements travel in one all-reduce.
    """
    out = list(sums)
    layouts: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        mesh = getattr(p, "device_mesh", None)
        if mesh is None:
            continue
        dims = tuple(d for d, place in enumerate(p.placements) if place.is_shard())
        if dims:
            layouts.setdefault((id(mesh), dims), []).append(i)
    if not layouts:
        return out
    import torch.distributed as dist

    for (_, dims), index in layouts.items():
        mesh = params[index[0]].device_mesh
        packed = torch.stack([out[i] for i in index])
        for d in dims:
            dist.all_reduce(packed, group=mesh.get_group(d))
        for j, i in enumerate(index):
            out[i] = packed[j]
    return out


def is_decayed(name: str, param: nn.Parameter) -> bool:
    """Matrices (attention, MLP, adapter) and the embedding decay; norm weights and qk_bias do not."""
    return param.dim() >= 2 and not name.endswith("qk_bias")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The recipe's two groups (decayed / not decayed), each tied parameter listed once."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if is_decayed(name, p) else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def global_grad_norm(parameters: list[nn.Parameter]) -> float:
    """The L2 norm of all gradients together (inf/nan when any gradient is non-finite).

    Works for plain tensors and FSDP2's sharded DTensors (the norm is reduced over all shards).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    return float(total)


def clip_grads_(parameters: list[nn.Parameter], max_norm: float, total: float) -> None:
    """Scale gradients so that their global norm is at most ``max_norm``, given the measured total."""
    if max_norm <= 0 or not math.isfinite(total) or total <= max_norm:
        return
    scale = max_norm / (total + 1e-6)
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(scale)
