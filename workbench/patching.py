"""Activation patching over depth: which (position, iteration) of the recurrence carries the answer.

The corrupted run gets the clean run's activation put in at one (position, step) of a hook (denoising;
``direction="noising"`` puts the corrupted activation into the clean run instead). The measure is
``restored`` = (m_patched − m_corrupted) / (m_clean − m_corrupted), m the log-probability of the target
token at the last position: 1 = the patch alone restores the clean answer, 0 = it changes nothing.
Many patches run as one batched forward (each batch row carries its own patch), and a patch of the
core state s_i resumes from the cached s_i instead of recomputing the first i iterations. Patches
that put in what the base run already has (positions before the corrupted token, a shared s_0) are
not run: they restore exactly 0 (or 1 when noising).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .collect import as_token_ids
from .interventions_common import (
    cached_index,
    check_steps,
    hook_steps,
    log_probs,
    run_init,
    token_labels,
)

DIRECTIONS = ("denoising", "noising")


def _positions(positions: str | Sequence[int], length: int) -> list[int]:
    """ "each" → 0 … T−1, "all" → [−1] (every position at once), or explicit positions in range."""
    if isinstance(positions, str):
        if positions == "each":
            return list(range(length))
        if positions == "all":
            return [-1]
        raise ValueError(
            f'positions must be "each", "all" or a list of positions, got {positions!r}'
        )
    chosen = [int(p) for p in positions]
    bad = [p for p in chosen if not 0 <= p < length]
    if bad or not chosen:
        raise ValueError(f"positions {bad or chosen} are not within 0 … {length - 1}")
    return chosen


def _cell_masks(
    cells: list[tuple[int, int | None]], length: int, device: torch.device
) -> dict[int | None, torch.Tensor]:
    """Per step, a (B, T, 1) mask of where each batch row's patch goes (B = len(cells))."""
    masks: dict[int | None, torch.Tensor] = {}
    for row, (pos, step) in enumerate(cells):
        mask = masks.setdefault(
            step, torch.zeros(len(cells), length, 1, dtype=torch.bool, device=device)
        )
        if pos < 0:
            mask[row] = True
        else:
            mask[row, pos] = True
    return masks


def _patch_hook(cells: list[tuple[int, int | None]], source: torch.Tensor, hook: str, length: int):
    """A hook that writes ``source``'s activation into batch row b at cell b's (position, step).

    ``source`` is run_with_cache's tensor for the hook (stacked over steps when iterated, batch 1).
    Rows are grouped by step once, so each firing costs one masked ``where``.
    """
    masks = _cell_masks(cells, length, source.device)

    def fn(x: torch.Tensor, h) -> torch.Tensor | None:
        mask = masks.get(h.step)
        if mask is None:
            return None
        index = cached_index(hook, h.step)
        src = source if index is None else source[index]
        return torch.where(mask, src[0].to(x.dtype), x)

    return fn


def _batches(
    cells: list[tuple[int, int | None]], todo: list[int], batch_size: int, by_step: bool
) -> list[list[int]]:
    """The cell indices ``todo`` in forward-sized batches; with ``by_step`` one step per batch."""
    order = sorted(todo, key=lambda i: cells[i][1]) if by_step else todo
    batches: list[list[int]] = []
    for i in order:
        last = batches[-1] if batches else None
        same_step = last is not None and (not by_step or cells[last[0]][1] == cells[i][1])
        if last is not None and same_step and len(last) < batch_size:
            last.append(i)
        else:
            batches.append([i])
    return batches


def _changes(
    cell: tuple[int, int | None], source: torch.Tensor, base: torch.Tensor, hook: str
) -> bool:
    """Whether the patch puts in anything the base run does not already have there (positions
    before a corrupted token, and s_0, are the same in both runs: their patches change nothing)."""
    pos, step = cell
    index = cached_index(hook, step)
    a = source[0] if index is None else source[index][0]
    b = base[0] if index is None else base[index][0]
    return not (torch.equal(a, b) if pos < 0 else torch.equal(a[pos], b[pos]))


def patch_states(
    model,
    clean_ids: torch.Tensor | np.ndarray | Sequence[int],
    corrupted_ids: torch.Tensor | np.ndarray | Sequence[int],
    num_steps: int,
    *,
    target: int | None = None,
    positions: str | Sequence[int] = "each",
    hook: str = "core.hook_state",
    init_scale: float = 0.0,
    steps: Sequence[int] | None = None,
    direction: str = "denoising",
    batch_size: int = 64,
    seed: int = 0,
    reuse_prefix: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Patch ``hook``'s activation between a clean and a corrupted run at every (position, step).

    clean_ids / corrupted_ids: one sequence each, same length. ``positions``: "each" (one patch per
    position), "all" (every position at once, reported as position −1) or a list. ``steps``: the
    iterations to patch (default: every step the hook fires: 0 … r for core.hook_state, 1 … r for the
    per-iteration core sub-layer hooks; hooks outside the core fire once and get step −1). s_0 is
    zeros for init_scale 0, else one seeded draw shared by every run. ``target``: the token whose
    last-position log-probability is measured (default: the clean run's top token there).
    ``direction``: "denoising" (clean activation into the corrupted run) or "noising" (corrupted
    activation into the clean run); ``restored`` has the same formula for both. ``batch_size``
    patches run per batched forward (1 = one at a time). ``reuse_prefix`` (per-iteration hooks): a
    patch at step i starts from the base run's cached s_i with the patch put in (core.hook_state) or
    from s_{i−1} with the patch put in during the first iteration (the core's sub-layer hooks), and
    runs only the remaining iterations (the core has no step-dependent weights), halving a full
    grid's cost; False runs every patch from s_0 through the hook.

    Returns one row per (position, step): ``position``, ``step``, ``token``, ``restored`` and
    ``logprob`` (m_patched).
    """
    clean = as_token_ids(clean_ids, "clean_ids").to(model.device)
    corrupted = as_token_ids(corrupted_ids, "corrupted_ids").to(model.device)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean_ids and corrupted_ids must have the same length, got {clean.shape[1]} and "
            f"{corrupted.shape[1]}"
        )
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    num_steps = int(num_steps)
    length = clean.shape[1]
    chosen_steps = check_steps(steps, hook_steps(model, hook, num_steps), hook)
    chosen_positions = _positions(positions, length)

    with torch.inference_mode():
        init = run_init(model, length, init_scale, seed, 1)
        # per-iteration hooks resume from the base run's core states: record those too
        iterated = chosen_steps != [None]
        names = sorted({hook, "core.hook_state"}) if iterated else [hook]
        out_clean, cache_clean = model.run_with_cache(
            clean, num_steps=num_steps, names_filter=names, **init
        )
        out_corr, cache_corr = model.run_with_cache(
            corrupted, num_steps=num_steps, names_filter=names, **init
        )
        lp_clean, lp_corr = log_probs(out_clean.logits), log_probs(out_corr.logits)
        if target is None:
            target = int(lp_clean[0].argmax())
        if not 0 <= int(target) < lp_clean.shape[-1]:
            raise ValueError(f"target {target} is not a token id of this model")
        m_clean, m_corr = float(lp_clean[0, target]), float(lp_corr[0, target])
        if m_clean == m_corr:
            raise ValueError(
                "the clean and corrupted runs give the target the same log-probability "
                f"({m_clean:.6g}): restored is undefined; pick another target or corruption"
            )
        if direction == "denoising":
            base_ids, source = corrupted, cache_clean[hook]
        else:
            base_ids, source = clean, cache_corr[hook]

        cells = [(p, s) for p in chosen_positions for s in chosen_steps]
        # s_i determines everything after step i: a patch at step i resumes from the base run's
        # cached state (s_i patched, or s_{i−1} for a hook inside iteration i) instead of
        # recomputing the iterations before it
        resume = reuse_prefix and iterated
        base_cache = cache_corr if direction == "denoising" else cache_clean
        base_acts, base_states = base_cache[hook], base_cache.get("core.hook_state")
        # a patch that puts in what is already there leaves the base run's log-probability
        patched = np.full(len(cells), m_corr if direction == "denoising" else m_clean)
        todo = [i for i, cell in enumerate(cells) if _changes(cell, source, base_acts, hook)]
        batches = _batches(cells, todo, int(batch_size), by_step=resume)
        for index in tqdm(batches, desc="patching", disable=not progress):
            chunk = [cells[i] for i in index]
            ids = base_ids.expand(len(chunk), -1)
            if resume and hook == "core.hook_state":
                step = chunk[0][1]
                mask = _cell_masks(chunk, length, source.device)[step]
                state = torch.where(mask, source[step][0], base_acts[step][0])
                out = model(ids, num_steps=num_steps - step, init_state=state)
            elif resume:  # iteration `step` becomes the resumed run's first
                step = chunk[0][1]
                fn = _patch_hook([(p, 1) for p, _ in chunk], source[step - 1 :], hook, length)
                state = base_states[step - 1].expand(len(chunk), -1, -1)
                with model.hooks([(hook, fn)]):
                    out = model(ids, num_steps=num_steps - step + 1, init_state=state)
            else:
                fn = _patch_hook(chunk, source, hook, length)
                init = run_init(model, length, init_scale, seed, len(chunk))
                with model.hooks([(hook, fn)]):
                    out = model(ids, num_steps=num_steps, **init)
            patched[index] = log_probs(out.logits)[:, target].cpu().numpy()

    labels = token_labels(model, clean)
    return pd.DataFrame(
        {
            "position": [p for p, _ in cells],
            "step": [-1 if s is None else s for _, s in cells],
            "token": ["(all)" if p < 0 else labels[p] for p, _ in cells],
            "restored": (patched - m_corr) / (m_clean - m_corr) + 0.0,  # no -0.0
            "logprob": patched,
        }
    )
