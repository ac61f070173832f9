"""Activation patching over depth: which (position, iteration) of the recurrence carries the answer.

The corrupted run gets the clean run's activation put in at one (position, step) of a hook (denoising;
``direction="noising"`` puts the corrupted activation into the clean run instead). The measure is
``restored`` = (m_patched − m_corrupted) / (m_clean − m_corrupted): 1 = the patch alone restores the
clean answer, 0 = it changes nothing. m is read at the last position, either the log-probability of
the target token (``metric="logprob"``) or the logit difference logit(target) − logit(corrupted
target) (``metric="logit_diff"``, the clean answer against the corrupted run's answer).

``restored`` divides by the gap m_clean − m_corrupted. Below ``MIN_GAP`` (0.1 nats or logits) the
frame says so (``gap_too_small``): the two runs then give the target nearly the same score (a factor
e^0.1 ≈ 1.1 in probability), so there is no difference in answer for a patch to restore, and the
ratio's float32 rounding (about 1e-5 in m between batched and single forwards) is no longer small
against the gap's own size. Such a grid is noise divided by a small number; figures and the app show
the gap instead of a colour scale.

Many patches run as one batched forward (each batch row carries its own patch), and a patch of a
per-iteration hook resumes from the base run's cache instead of recomputing the first iterations
(``reuse_prefix``): a patch of core.hook_state at step i starts from the cached s_i with the patch
put in, one of the core's sub-layer hooks from s_{i−1} with the patch put in during the first
iteration, and either runs only the remaining iterations (the core has no step-dependent
weights). Patches that put in what the base run already has (positions before the corrupted token,
a shared s_0) are not run: they restore exactly 0 (or 1 when noising).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from recurrent_model.hook_names import STATE
from tasks.arithmetic import DEFAULT_PATCHING_PAIR, PromptPair

from .collect import as_token_ids
from .interventions_common import (
    Cancelled,
    cached_index,
    check_steps,
    hook_steps,
    run_init,
    token_labels,
)

DIRECTIONS = ("denoising", "noising")
METRICS = ("logprob", "logit_diff")
MIN_GAP = 0.1  # |m_clean − m_corrupted| below this is too small to normalise by (module docstring)


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


Progress = bool | Callable[[int, int], object]


def _scores(logits: torch.Tensor, metric: str, target: int, corrupted_target: int | None):
    """(metric values, target log-probabilities) at the last position of logits (B, T, V), (B,)."""
    last = logits[:, -1].float()
    logprob = torch.log_softmax(last, dim=-1)[:, target]
    if metric == "logprob":
        return logprob, logprob
    return last[:, target] - last[:, corrupted_target], logprob


def _answers(out_clean, out_corr, target, corrupted_target, metric) -> tuple[int, int | None]:
    """The target (default: the clean run's top token) and, for logit_diff, the corrupted target
    (default: the corrupted run's top token), both checked."""
    vocab = out_clean.logits.shape[-1]
    target = int(out_clean.logits[0, -1].argmax()) if target is None else int(target)
    if not 0 <= target < vocab:
        raise ValueError(f"target {target} is not a token id of this model")
    if metric == "logprob":
        return target, None
    if corrupted_target is None:
        corrupted_target = int(out_corr.logits[0, -1].argmax())
        if corrupted_target == target:
            raise ValueError(
                "the corrupted run's top token is the target itself: the two answers do not "
                "differ, so logit_diff has nothing to compare; pass corrupted_target or pick a "
                "corruption that changes the answer"
            )
    corrupted_target = int(corrupted_target)
    if not 0 <= corrupted_target < vocab:
        raise ValueError(f"corrupted_target {corrupted_target} is not a token id of this model")
    if corrupted_target == target:
        raise ValueError("target and corrupted_target are the same token: logit_diff is always 0")
    return target, corrupted_target


def _reporter(progress: Progress, total: int, should_stop: Callable[[], bool] | None):
    """A function called before each batch with the patches done so far: reports progress (tqdm
    bar or ``progress(done, total)``) and raises `Cancelled` when ``should_stop()`` is true."""
    bar = tqdm(total=total, desc="patching", disable=progress is not True)

    def report(done: int) -> None:
        if callable(progress):
            progress(done, total)
        bar.update(done - bar.n)
        if done == total:
            bar.close()
        elif should_stop is not None and should_stop():
            bar.close()
            raise Cancelled(f"patching stopped after {done} of {total} patches")

    return report


def _checked_pair(
    model, clean_ids, corrupted_ids, direction: str, metric: str, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clean and corrupted ids as (1, T) tensors on the model's device, and the options checked."""
    clean = as_token_ids(clean_ids, "clean_ids").to(model.device)
    corrupted = as_token_ids(corrupted_ids, "corrupted_ids").to(model.device)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean_ids and corrupted_ids must have the same length, got {clean.shape[1]} and "
            f"{corrupted.shape[1]}"
        )
    if torch.equal(clean, corrupted):
        raise ValueError(
            "clean_ids and corrupted_ids are identical: restored is undefined; corrupt a token"
        )
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return clean, corrupted


def patch_states(
    model,
    clean_ids: torch.Tensor | np.ndarray | Sequence[int],
    corrupted_ids: torch.Tensor | np.ndarray | Sequence[int],
    num_steps: int,
    *,
    target: int | None = None,
    corrupted_target: int | None = None,
    metric: str = "logprob",
    positions: str | Sequence[int] = "each",
    hook: str = STATE,
    init_scale: float = 0.0,
    steps: Sequence[int] | None = None,
    direction: str = "denoising",
    batch_size: int = 64,
    seed: int = 0,
    reuse_prefix: bool = True,
    progress: Progress = False,
    should_stop: Callable[[], bool] | None = None,
    min_gap: float = MIN_GAP,
) -> pd.DataFrame:
    """Patch ``hook``'s activation between a clean and a corrupted run at every (position, step).

    clean_ids / corrupted_ids: one sequence each, same length. ``positions``: "each" (one patch per
    position), "all" (every position at once, reported as position −1) or a list. ``steps``: the
    iterations to patch (default: every step the hook fires: 0 … r for core.hook_state, 1 … r for the
    per-iteration core sub-layer hooks; hooks outside the core fire once and get step −1). s_0 is
    zeros for init_scale 0, else one seeded draw shared by every run. ``metric``: "logprob" (m =
    log p(target)) or "logit_diff" (m = logit(target) − logit(corrupted_target)), both at the last
    position; ``target`` defaults to the clean run's top token there, ``corrupted_target`` to the
    corrupted run's. ``direction``: "denoising" (clean activation into the corrupted run) or
    "noising" (corrupted activation into the clean run); ``restored`` has the same formula for both.
    ``batch_size`` patches run per batched forward (1 = one at a time). ``reuse_prefix``: resume
    each patch of a per-iteration hook from the base run's cached states (module docstring); False
    runs every patch from s_0 through the hook.

    ``progress``: True for a tqdm bar, or a callable ``progress(done, total)`` (patches) called
    before every batch and at the end; it may raise to stop. ``should_stop()``, checked before
    every batch, stops the run by raising `Cancelled` (nothing partial is returned).

    Returns one row per (position, step): ``position``, ``step``, ``token``, ``restored``,
    ``patched`` (m of the patched run), ``clean`` and ``corrupted`` (m of the two unpatched runs),
    ``logprob`` (the target's log-probability in the patched run) and ``gap_too_small``
    (|clean − corrupted| < ``min_gap``, default MIN_GAP: restored is not meaningful). ``frame.attrs`` holds
    ``metric``, ``target``, ``corrupted_target``, ``gap`` and ``min_gap``.
    """
    clean, corrupted = _checked_pair(model, clean_ids, corrupted_ids, direction, metric, batch_size)
    chosen_steps = check_steps(steps, hook_steps(model, hook, int(num_steps)), hook)
    settings = _Settings(num_steps=int(num_steps), hook=hook, direction=direction,
                         init_scale=init_scale, seed=seed, reuse_prefix=reuse_prefix,
                         batch_size=int(batch_size))  # fmt: skip
    cells = [(p, s) for p in _positions(positions, clean.shape[1]) for s in chosen_steps]
    with torch.inference_mode():
        plan = _plan(model, (clean, corrupted), settings, cells, (metric, target, corrupted_target))
        patched, logprob = _run_plan(model, plan, _reporter(progress, plan.todo, should_stop))
    return _frame(plan, token_labels(model, clean), patched, logprob, float(min_gap))


@dataclass(frozen=True)
class _Settings:
    """How every patch of one `patch_states` call runs."""

    num_steps: int
    hook: str
    direction: str
    init_scale: float
    seed: int
    reuse_prefix: bool
    batch_size: int


@dataclass
class _Plan:
    """The two unpatched runs and the patches still to run: the base run (the one patched), the
    source activations put into it, each cell's (position, step), the cells that change anything,
    grouped in batches, and each cell's score, starting at the base run's own."""

    settings: _Settings
    base_ids: torch.Tensor
    base_cache: dict
    source: torch.Tensor
    cells: list[tuple[int, int | None]]
    batches: list[list[int]]
    resume: bool
    answer: tuple[str, int, int | None]
    m_clean: float
    m_corrupted: float
    patched: np.ndarray
    logprob: np.ndarray

    @property
    def todo(self) -> int:
        return sum(len(b) for b in self.batches)


def _plan(model, ids: tuple[torch.Tensor, torch.Tensor], settings: _Settings, cells, answers):
    """Run the clean and corrupted prompts once with a cache and decide which patches to run."""
    clean, corrupted = ids
    hook, num_steps = settings.hook, settings.num_steps
    init = run_init(model, clean.shape[1], settings.init_scale, settings.seed, 1)
    # per-iteration hooks resume from the base run's core states: record those too
    iterated = any(step is not None for _, step in cells)
    names = sorted({hook, STATE}) if iterated else [hook]
    runs = [
        model.run_with_cache(x, num_steps=num_steps, names_filter=names, **init)
        for x in (clean, corrupted)
    ]
    (out_clean, cache_clean), (out_corr, cache_corr) = runs
    metric, target, corrupted_target = answers
    target, corrupted_target = _answers(out_clean, out_corr, target, corrupted_target, metric)
    answer = (metric, target, corrupted_target)
    denoising = settings.direction == "denoising"
    base_ids, base_out, base_cache = (
        (corrupted, out_corr, cache_corr) if denoising else (clean, out_clean, cache_clean)
    )
    source = (cache_clean if denoising else cache_corr)[hook]
    patched, logprob = (
        np.repeat(v.cpu().numpy().astype(float), len(cells))
        for v in _scores(base_out.logits, *answer)
    )
    todo = [i for i, cell in enumerate(cells) if _changes(cell, source, base_cache[hook], hook)]
    resume = settings.reuse_prefix and iterated
    return _Plan(
        settings,
        base_ids,
        base_cache,
        source,
        cells,
        _batches(cells, todo, settings.batch_size, by_step=resume),
        resume,
        answer,
        m_clean=float(_scores(out_clean.logits, *answer)[0][0]),
        m_corrupted=float(_scores(out_corr.logits, *answer)[0][0]),
        patched=patched,
        logprob=logprob,
    )


def _run_plan(model, plan: _Plan, report: Callable[[int], None]):
    """Every batch of the plan's patches, scored: (patched m, target log-probability) per cell."""
    patched, logprob, done = plan.patched.copy(), plan.logprob.copy(), 0
    for index in plan.batches:
        report(done)
        chunk = [plan.cells[i] for i in index]
        out = _run_patches(model, plan.base_ids.expand(len(chunk), -1), chunk, plan)
        values, lps = _scores(out.logits, *plan.answer)
        patched[index], logprob[index] = values.cpu().numpy(), lps.cpu().numpy()
        done += len(index)
    report(done)
    return patched, logprob


def _run_patches(model, ids, chunk, plan: _Plan):
    """The forward of one batch of patches (batch row b carries the patch of cell ``chunk[b]``)."""
    length, settings, source = ids.shape[1], plan.settings, plan.source
    hook, num_steps = settings.hook, settings.num_steps
    base_acts, base_states = plan.base_cache[hook], plan.base_cache.get(STATE)
    if plan.resume and hook == STATE:
        # s_i determines everything after step i: resume from the base run's patched s_i
        step = chunk[0][1]
        mask = _cell_masks(chunk, length, source.device)[step]
        state = torch.where(mask, source[step][0], base_acts[step][0])
        return model(ids, num_steps=num_steps - step, init_state=state)
    if plan.resume:
        # iteration `step` becomes the resumed run's first, from the base run's s_{step−1}
        step = chunk[0][1]
        fn = _patch_hook([(p, 1) for p, _ in chunk], source[step - 1 :], hook, length)
        state = base_states[step - 1].expand(len(chunk), -1, -1)
        with model.hooks([(hook, fn)]):
            return model(ids, num_steps=num_steps - step + 1, init_state=state)
    fn = _patch_hook(chunk, source, hook, length)
    init = run_init(model, length, settings.init_scale, settings.seed, len(chunk))
    with model.hooks([(hook, fn)]):
        return model(ids, num_steps=num_steps, **init)


def _frame(plan: _Plan, labels, patched, logprob, min_gap: float) -> pd.DataFrame:
    """The output frame (see `patch_states`); restored is NaN when the gap is exactly 0."""
    metric, target, corrupted_target = plan.answer
    cells, m_clean, m_corr = plan.cells, plan.m_clean, plan.m_corrupted
    gap = m_clean - m_corr
    restored = (patched - m_corr) / gap + 0.0 if gap != 0 else np.full(len(cells), np.nan)
    frame = pd.DataFrame(
        {
            "position": [p for p, _ in cells],
            "step": [-1 if s is None else s for _, s in cells],
            "token": ["(all)" if p < 0 else labels[p] for p, _ in cells],
            "restored": restored,  # + 0.0: no -0.0
            "patched": patched,
            "clean": m_clean,
            "corrupted": m_corr,
            "logprob": logprob,
            "gap_too_small": abs(gap) < min_gap,
        }
    )
    frame.attrs.update(
        metric=metric, target=target, corrupted_target=corrupted_target, gap=gap, min_gap=min_gap
    )
    return frame


@dataclass(frozen=True)
class PatchingPair:
    """Token ids of a clean and a corrupted prompt and their one-token answers (``patch_states``'
    ``target`` and ``corrupted_target``)."""

    clean_ids: tuple[int, ...]
    corrupted_ids: tuple[int, ...]
    target: int
    corrupted_target: int
    prompts: PromptPair


def patching_pair(model, pair: PromptPair = DEFAULT_PATCHING_PAIR) -> PatchingPair:
    """``pair`` encoded with the model's tokenizer; its answers must be one token each and the two
    prompts the same number of tokens (the default: "3 + 4 = " against "3 + 2 = ", answers 7 and 5).
    """
    tok = model.tokenizer
    if tok is None:
        raise ValueError("a patching pair is text: it needs a model with a tokenizer")
    clean, corrupted = tok.encode(pair.clean), tok.encode(pair.corrupted)
    if len(clean) != len(corrupted):
        raise ValueError(
            f"{pair.clean!r} and {pair.corrupted!r} are {len(clean)} and {len(corrupted)} tokens: "
            "patching needs prompts that align token by token"
        )
    answers = []
    for text in (pair.answer, pair.corrupted_answer):
        ids = tok.encode(text, add_bos=False)
        if len(ids) != 1:
            raise ValueError(f"the answer {text!r} is {len(ids)} tokens; it must be one token")
        answers.append(int(ids[0]))
    return PatchingPair(tuple(clean), tuple(corrupted), answers[0], answers[1], pair)
