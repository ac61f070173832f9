"""Collect latent trajectories from a model: several seeds and init scales, batched."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from recurrent_model import hook_names
from recurrent_model.hook_names import STATE
from recurrent_model.kv_cache import available_memory

from .trajectory import Trajectory

ProgressFn = Callable[[int, int], None]


class TrajectoryTooLarge(MemoryError):
    """A collection request that would not fit in the memory available for it."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(needed: int, max_bytes: int | None, what: str) -> None:
    """Raise TrajectoryTooLarge naming the size when ``needed`` exceeds the budget."""
    budget = int(0.8 * available_memory("cpu")) if max_bytes is None else int(max_bytes)
    if needed > budget:
        raise TrajectoryTooLarge(
            f"{what} needs about {_gib(needed)} ({needed:,} bytes) but only {_gib(budget)} is "
            "available: use fewer steps, seeds or tokens, dtype=np.float16, or a smaller batch_size"
        )


def as_token_ids(
    input_ids: torch.Tensor | np.ndarray | Sequence[int], what: str = "input_ids"
) -> torch.Tensor:
    """One sequence as a (1, T) long tensor; (T,) and (1, T) inputs are accepted (``what`` names
    the argument in the error)."""
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(
            f"{what} must be one non-empty sequence of token ids, (T,) or (1, T); got shape "
            f"{tuple(ids.shape)}"
        )
    return ids[None]


def token_strings(model: torch.nn.Module, ids: Sequence[int]) -> list[str]:
    """Display strings of token ids: the model's tokenizer, or the ids themselves without one."""
    tokenizer = getattr(model, "tokenizer", None)
    ids = [int(i) for i in ids]
    return tokenizer.token_strings(ids) if tokenizer is not None else [str(i) for i in ids]


def run_plan(seeds: Sequence[int], init_scale: float | Sequence[float]) -> list[tuple[int, float]]:
    """(seed, scale) for every run: every seed per scale; scale 0 once (s_0 = 0)."""
    scales = [float(init_scale)] if np.isscalar(init_scale) else [float(s) for s in init_scale]
    seeds = [int(s) for s in seeds]
    if not seeds or not scales:
        raise ValueError("collect needs at least one seed and one init scale")
    if any(s < 0 for s in scales):
        raise ValueError(f"init scales must be >= 0, got {scales}")
    plan: list[tuple[int, float]] = []
    for scale in scales:
        for seed in seeds[:1] if scale == 0 else seeds:
            if (seed, scale) not in plan:
                plan.append((seed, scale))
    return plan


def random_start(model: torch.nn.Module) -> bool:
    """Whether the model's family draws s_0 at random (Huginn, retrofitted); Ouro starts every run
    from the embedding, so its seeds and init scales all give one and the same run."""
    return bool(getattr(model, "random_initial_state", True))


def check_runs_differ(model: torch.nn.Module, plan: Sequence[tuple[int, float]]) -> None:
    """ValueError when several runs are asked of a family whose runs cannot differ."""
    if len(plan) > 1 and not random_start(model):
        family = getattr(model, "family", type(model).__name__)
        raise ValueError(
            f"{family} starts every run from the embedding (s_0 is not random): {len(plan)} seeds "
            "or init scales would be the same run; collect one seed"
        )


def initial_states(
    model: torch.nn.Module, plan: Sequence[tuple[int, float]], shape: tuple[int, int]
) -> torch.Tensor | None:
    """s_0 for each run, (len(plan), T, h), each drawn from its own generator seeded by its seed;
    None for a family that starts from the embedding (:func:`random_start`).

    Equal to the model's own draw for a batch of one with ``torch.Generator().manual_seed(seed)``,
    so a run is reproducible whatever it is batched with.
    """
    if not random_start(model):
        return None
    T, h = shape
    out = []
    for seed, scale in plan:
        template = torch.zeros(1, T, h, dtype=model.dtype)
        gen = torch.Generator().manual_seed(seed)
        out.append(model.initial_state(template, scale, gen)[0])
    return torch.stack(out)


ALIGN = 16  # rows of a GEMM block: a prompt's rows start and end on a multiple of this


def aligned_length(length: int, block_size: int) -> int:
    """Positions a prompt of ``length`` tokens occupies in a batch: right-padded to a multiple of
    ALIGN (at most ``block_size``, never below ``length``).

    Right padding under causal attention leaves every real position's states unchanged in exact
    arithmetic; CPU GEMM and attention kernels also round a row the same way whatever else is in
    the batch once every prompt starts and ends on this grid. So a prompt's states are the same
    bits alone, with other seeds, or beside other prompts of the same aligned length.
    """
    return max(length, min(-(-length // ALIGN) * ALIGN, block_size))


@torch.no_grad()
def run_states(
    model: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    init: Sequence[torch.Tensor] | torch.Tensor | None,
    num_steps: int,
    on_step: Callable | None = None,
    cache_device: torch.device | str | None = "cpu",
) -> torch.Tensor:
    """Raw states s_0 … s_r of several runs batched in the aligned layout: (steps + 1, B, W, h).

    ``prompts`` are 1-D token ids (B of them, each aligned to the same width W), ``init`` their
    s_0 as (T_b, h) each; positions past a prompt's length are padding (zero ids, zero s_0) and
    hold no meaning. ``on_step(x, hook)`` is called at every state (e.g. a progress tick);
    ``cache_device=None`` keeps the states on the model's device (no host synchronisation).
    """
    ids, start = aligned_batch(model, prompts, init)
    with model.hooks([] if on_step is None else [(STATE, on_step)]):
        _, cache = model.run_with_cache(
            ids,
            num_steps=num_steps,
            init_state=start,
            names_filter=STATE,
            cache_device=cache_device,
        )
    return cache[STATE].float()


def aligned_batch(
    model: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    init: Sequence[torch.Tensor] | torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ids, s_0) on the model's device, right-padded to the prompts' one aligned length; s_0 None
    when ``init`` is (the family's own start)."""
    block = model.config.block_size
    width = max(aligned_length(len(p), block) for p in prompts)
    if any(aligned_length(len(p), block) != width for p in prompts):
        raise ValueError("run_states batches prompts of one aligned length only")
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    if init is None:
        return ids.to(model.device), None
    start = torch.zeros(len(prompts), width, model.config.n_embd, dtype=model.dtype)
    for row, (prompt, s0) in enumerate(zip(prompts, init)):
        start[row, : len(prompt)] = s0[: len(prompt)]
    return ids.to(model.device), start.to(model.device)


def _ticker(on_progress: ProgressFn, start: int, stop: int, num_steps: int, total: int):
    """A hook on core.hook_state reporting (runs before the batch + iterations done) / total."""

    def tick(x: torch.Tensor, hook) -> None:
        if hook.step:  # s_0 is step 0: no iteration yet
            on_progress(start * num_steps + hook.step * (stop - start), total)

    return tick


def _check_collect_fits(
    model, T: int, runs: int, num_steps: int, dtype: np.dtype, batch_size: int, max_bytes
) -> None:
    """``TrajectoryTooLarge`` when the raw and normalised states, plus the float32 cache of one
    batch while it runs, exceed ``max_bytes``."""
    h = model.config.n_embd
    stored = runs * (num_steps + 1) * T * h * dtype.itemsize
    working = batch_size * (num_steps + 1) * T * h * 4
    check_fits(
        2 * stored + working,
        max_bytes,
        f"{runs} runs × {num_steps + 1} states × {T} "
        f"tokens × h={h} in {dtype.name} (raw + normalised)",
    )


def _collect_states(
    model, ids: torch.Tensor, plan, num_steps: int, dtype: np.dtype, batch_size: int,
    progress: bool, on_progress: ProgressFn | None,
) -> np.ndarray:  # fmt: skip
    """The raw states (runs, num_steps + 1, T, h) of every run of ``plan``, ``batch_size`` runs
    per batch, reporting to ``on_progress`` after every core iteration."""
    T, h = ids.shape[1], model.config.n_embd
    raw = np.empty((len(plan), num_steps + 1, T, h), dtype=dtype)
    init = initial_states(model, plan, (T, h))
    batches = range(0, len(plan), batch_size)
    total = len(plan) * num_steps
    if on_progress is not None:
        on_progress(0, total)
    for start in tqdm(batches, desc=f"collect {model.name}", disable=not progress, leave=False):
        stop = min(start + batch_size, len(plan))
        ticks = None if on_progress is None else _ticker(on_progress, start, stop, num_steps, total)
        runs = None if init is None else init[start:stop]
        states = run_states(model, [ids[0]] * (stop - start), runs, num_steps, ticks)
        raw[start:stop] = states[:, :, :T].permute(1, 0, 2, 3).numpy().astype(dtype, copy=False)
    return raw


@torch.no_grad()
def collect(
    model: torch.nn.Module,
    input_ids: torch.Tensor | np.ndarray | Sequence[int],
    num_steps: int,
    seeds: Sequence[int] = (0,),
    init_scale: float | Sequence[float] = 1.0,
    *,
    normalized: bool = True,
    dtype: np.dtype | type = np.float32,
    batch_size: int = 8,
    max_bytes: int | None = None,
    progress: bool = True,
    on_progress: ProgressFn | None = None,
) -> Trajectory:
    """Run ``input_ids`` for ``num_steps`` core iterations per (seed, init scale); keep s_0 … s_r.

    Runs are batched ``batch_size`` at a time, in the aligned layout of :func:`run_states`, so a
    run's states do not depend on the batch it ran in. ``dtype`` (float32 or float16) is the storage type.
    ``max_bytes`` caps the memory the result may take (default: 80% of what is available); a
    request over it raises ``TrajectoryTooLarge`` naming the size before any work is done.
    ``on_progress(done, total)`` is called after every core iteration of every batch, counting
    (run, iteration) pairs: total = runs × num_steps (e.g. for a progress bar in an app).
    """
    ids = as_token_ids(input_ids)
    num_steps = int(num_steps)
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    plan = run_plan(seeds, init_scale)
    check_runs_differ(model, plan)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float16):
        raise ValueError(f"dtype must be float32 or float16, got {dtype}")
    batch_size = max(1, min(int(batch_size), len(plan)))
    _check_collect_fits(model, ids.shape[1], len(plan), num_steps, dtype, batch_size, max_bytes)
    raw = _collect_states(model, ids, plan, num_steps, dtype, batch_size, progress, on_progress)
    tokens = token_strings(model, ids[0].tolist())
    norm = model.state_norm()
    return Trajectory(
        raw_states=raw,
        token_ids=ids[0].numpy().astype(np.int64),
        tokens=list(tokens),
        seeds=tuple(seed for seed, _ in plan),
        init_scales=tuple(scale for _, scale in plan),
        model_name=str(model.name),
        norm_weight=None if norm is None else norm.weight.detach().float().cpu().numpy(),
        norm_eps=float(norm.eps) if norm is not None else 0.0,
        normalized=normalized,
    )


@torch.no_grad()
def collect_sublayers(
    model: torch.nn.Module,
    input_ids: torch.Tensor | np.ndarray | Sequence[int],
    num_steps: int,
    seed: int = 0,
    init_scale: float = 1.0,
    max_bytes: int | None = None,
) -> np.ndarray:
    """Raw per-sub-layer core states core.{j}.hook_resid_post: (num_steps, n_core, T, h).

    Index [i − 1, j] is the output of core layer j in iteration i; [i − 1, −1] equals s_i.
    """
    ids = as_token_ids(input_ids)
    n_core = model.config.n_layers_in_recurrent_block
    T, h = ids.shape[1], model.config.n_embd
    check_fits(
        2 * num_steps * n_core * T * h * 4,
        max_bytes,
        f"{num_steps} steps × {n_core} core layers × {T} tokens × h={h}",
    )
    names = [hook_names.core(j) for j in range(n_core)]
    init = initial_states(model, [(seed, float(init_scale))], (T, h))
    batch, start = aligned_batch(model, [ids[0]], init)  # the layout of ``collect``
    _, cache = model.run_with_cache(
        batch,
        num_steps=num_steps,
        init_state=start,
        names_filter=lambda name: name in names,
        cache_device="cpu",
    )
    return torch.stack([cache[n][:, 0, :T].float() for n in names], dim=1).numpy()
