"""The corpus engine: every analysis of one prompt, over a dataset, on as many ranks as torchrun
(or SLURM) gives, resumable, into one Parquet dataset.

Each rank takes its device from LOCAL_RANK (gloo on the CPU, nccl/rccl on GPUs). The units are
fixed by the data; rank 0 decides which are still to do (finished parts verify) and every rank
takes every world-th of them, so a relaunch on any number of ranks does each unit exactly once.
Ranks do not talk while they work: each writes its own parts and a small progress file, from
which rank 0 draws one bar over all ranks.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

import recurrent_model as rm
from recurrent_model.atomic_io import atomic_write_text

from ..collect import check_runs_differ, initial_states, run_states, token_strings
from . import store
from .analyses import (
    Settings,
    dynamics_rows,
    lens_columns,
    normalise,
    seed_columns,
    stability_columns,
)
from .sources import CorpusError, read_prompts
from .units import Run, Unit, batches, make_units, tokenize

VERSION = 3  # the rows' layout and arithmetic (a run of another version is not resumed); part of the identity


@dataclass(frozen=True)
class Job:
    """Everything a corpus run needs besides the model: the data, the settings and the sizes."""

    data: str | None
    settings: Settings
    column: str | None = None
    split: str = "train"
    per_source: int = 50
    max_tokens: int | None = None
    unit_tokens: int = 2048
    max_batch_tokens: int | None = None


def weights_hash(model: rm.RecurrentLM) -> str:
    """blake2b over every parameter and buffer (name, dtype, shape, bytes) in name order."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def identity(model: rm.RecurrentLM, job: Job, units: list[Unit]) -> dict[str, Any]:
    """What makes two runs the same run: model, config, settings and data."""
    fingerprint = hashlib.sha256(
        "\n".join(
            f"{t.prompt.id}:{','.join(map(str, t.ids))}" for u in units for t in u.prompts
        ).encode()
    ).hexdigest()[:16]
    return {
        "model": {
            "name": str(model.name),
            "weights": weights_hash(model),
            "dtype": str(model.dtype),
        },
        "config": model.config.to_dict(),
        "settings": {**asdict(job.settings), "version": VERSION, "unit_tokens": job.unit_tokens},
        "data": {
            "source": job.data or "heldout",
            "fingerprint": fingerprint,
            "prompts": sum(len(u.prompts) for u in units),
            "tokens": sum(u.tokens for u in units),
            "max_tokens": job.max_tokens,
        },
    }


def batch_token_budget(model: rm.RecurrentLM, num_steps: int, cap: int | None) -> int:
    """Padded positions per batch: the states of every step kept for analysis (float32 on the host,
    and on the device while the batch runs) within a quarter of the free memory, capped by ``cap``."""
    from recurrent_model.kv_cache import available_memory

    # s_0 … s_r of a position in float32, three copies: raw, normalised, working
    per_token = 3 * (num_steps + 1) * model.config.n_embd * 4
    budget = int(0.25 * available_memory(str(model.device)) // per_token)
    if model.device.type != "cpu":
        budget = min(budget, int(0.25 * available_memory("cpu") // per_token))
    return max(16, min(budget, cap) if cap else budget)


@dataclass
class Batch:
    """What a batch's forward hands to the host thread: the runs with their token strings, their
    normalised states side by side on the token axis (steps + 1, ΣT, h) and their lens columns."""

    runs: list[Run]
    tokens: list[list[str]]
    states: np.ndarray
    lens: dict[str, np.ndarray]


def run_batch(model: rm.RecurrentLM, runs: list[Run], settings: Settings) -> Batch:
    """The batch's forward, its lens, and its real positions normalised, on the model's device;
    one copy to the host."""
    h = model.config.n_embd
    starts = [initial_states(model, [(seed, settings.init_scale)], (len(item.ids), h))
              for item, seed in runs]  # fmt: skip
    init = None if starts[0] is None else [s[0] for s in starts]
    prompts = [torch.tensor(item.ids) for item, _ in runs]
    raw = run_states(model, prompts, init, settings.num_steps, cache_device=None)
    lengths = torch.tensor([len(item.ids) for item, _ in runs], device=raw.device)
    valid = torch.arange(raw.shape[2], device=raw.device) < lengths[:, None]  # (B, W)
    lens = {}
    if "lens" in settings.analyses:
        lens = lens_columns(model, raw, valid, settings.lens_steps)
    states = normalise(model, raw, valid)
    tokens = [token_strings(model, item.ids) for item, _ in runs]
    lens = {name: column.cpu().numpy() for name, column in lens.items()}
    return Batch(runs, tokens, states.cpu().numpy(), lens)


def batch_rows(batch: Batch, eps: float) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The batch's rows and each run's final normalised state (for the seeds analysis), keyed
    ``prompt_id:seed``: the host's numpy work, run beside the next batch's forward."""
    frame = dynamics_rows(batch.runs, batch.states, batch.tokens, eps).assign(**batch.lens)
    offsets = np.cumsum([0] + [len(item.ids) for item, _ in batch.runs])
    finals = {f"{item.prompt.id}:{seed}": batch.states[-1, start:end]
              for (item, seed), start, end in zip(batch.runs, offsets, offsets[1:])}  # fmt: skip
    return frame, finals


class UnitFailed(Exception):
    """A unit's analysis raised (the cause is chained)."""

    def __init__(self, unit: Unit) -> None:
        super().__init__(f"unit {unit.index}")
        self.unit = unit


def analyse_units(
    model: rm.RecurrentLM,
    units: Sequence[Unit],
    settings: Settings,
    batch_tokens: int,
    tick: Callable[[int], None] | None = None,
    ahead: int = 2,
) -> Iterator[tuple[Unit, pd.DataFrame]]:
    """Every row of each unit, unit by unit, in (prompt order, seed, position) order.

    Each batch's forward and lens run here, on the model's device; its host part (classifying,
    the frame) runs on one background thread while the next batches run forward, at most
    ``ahead`` batches behind. ``tick(tokens)`` after each batch's rows. A failure raises
    ``UnitFailed`` naming its unit, after the units finished before it are yielded.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="corpus-host") as pool:
        queued: deque[tuple[Unit, list[Future]]] = deque()
        for unit in units:
            futures: list[Future] = []
            try:
                for runs in batches(unit, settings.seeds, model.config.block_size, batch_tokens):
                    batch = run_batch(model, runs, settings)
                    futures.append(pool.submit(batch_rows, batch, settings.eps))
                    while queued and _waiting(queued) + len(futures) > ahead:
                        yield _finish(model, *queued.popleft(), settings, tick)
                    if len(futures) > ahead:
                        wait([futures[-ahead - 1]])
            except Exception as exc:
                while queued:
                    yield _finish(model, *queued.popleft(), settings, tick)
                raise UnitFailed(unit) from exc
            queued.append((unit, futures))
        while queued:
            yield _finish(model, *queued.popleft(), settings, tick)


def _waiting(queued: deque[tuple[Unit, list[Future]]]) -> int:
    return sum(not f.done() for _, futures in queued for f in futures)


def _finish(
    model: rm.RecurrentLM, unit: Unit, futures: list[Future], settings: Settings, tick
) -> tuple[Unit, pd.DataFrame]:
    """The unit's rows from its batches' host parts, sorted, with the per-prompt columns."""
    try:
        frames: list[pd.DataFrame] = []
        finals: dict[str, np.ndarray] = {}
        for future in futures:
            frame, last = future.result()
            frames.append(frame)
            finals.update(last)
            if tick is not None:
                tick(len(frame))
        frame = pd.concat(frames, ignore_index=True)
        order = {t.prompt.id: i for i, t in enumerate(unit.prompts)}
        frame = frame.sort_values(
            ["prompt_id", "seed", "position"],
            key=lambda c: c.map(order) if c.name == "prompt_id" else c,
        ).reset_index(drop=True)
        return unit, _prompt_columns(model, unit, settings, frame, finals)
    except Exception as exc:
        raise UnitFailed(unit) from exc


def _prompt_columns(
    model: rm.RecurrentLM, unit: Unit, settings: Settings, frame: pd.DataFrame, finals: dict
) -> pd.DataFrame:
    """Columns that need every seed of a prompt (seeds) or one run per prompt (stability)."""
    extra: list[dict[str, np.ndarray]] = []
    for item in unit.prompts:
        cols: dict[str, np.ndarray] = {}
        if "seeds" in settings.analyses:
            rows = frame[frame["prompt_id"] == item.prompt.id]
            kinds = rows["kind"].to_numpy().reshape(len(settings.seeds), len(item.ids))
            ends = np.stack([finals[f"{item.prompt.id}:{s}"] for s in settings.seeds])
            cols.update(seed_columns(ends, kinds))
        if "stability" in settings.analyses:
            cols.update(stability_columns(model, item, settings.num_steps))
        extra.append({k: np.tile(v, len(settings.seeds)) for k, v in cols.items()})
    if extra and extra[0]:
        for name in extra[0]:
            frame[name] = np.concatenate([e[name] for e in extra])
    return frame


def rank_context():
    """This process's rank, world size and device (one process without torchrun)."""
    from cluster.context import init_distributed

    return init_distributed("auto", timeout_minutes=60)


def run(
    model: rm.RecurrentLM, job: Job, out: str | Path, *, progress: bool = True, ctx=None
) -> Path:
    """Analyse the job's prompts into ``out``; returns ``out``. Under torchrun, call it on every
    rank (``ctx`` from :func:`rank_context`): rank 0 writes the manifest and the summary."""
    from cluster.context import DistContext

    ctx = ctx or DistContext()
    check_runs_differ(model, [(seed, job.settings.init_scale) for seed in job.settings.seeds])
    out = Path(out)
    prompts = read_prompts(job.data, job.column, job.split, job.per_source)
    tokenized, dropped = tokenize(prompts, model.tokenizer, model.config.block_size, job.max_tokens)
    units = make_units(tokenized, job.unit_tokens)
    todo = _agree_on_work(ctx, out, model, job, units, dropped)
    mine = [units[i] for i in todo[ctx.rank :: ctx.world_size]]
    total = sum(units[i].tokens for i in todo) * len(job.settings.seeds)
    batch_tokens = batch_token_budget(model, job.settings.num_steps, job.max_batch_tokens)
    bar = _Progress(out, ctx, total, progress and ctx.is_main)
    _write_units(model, mine, job.settings, batch_tokens, out, ctx, bar)
    bar.finish()
    ctx.barrier()
    if ctx.is_main:
        store.record_timings(out, units)
        from .summary import write_summary

        write_summary(out)
    return out


def _agree_on_work(ctx, out: Path, model, job: Job, units: list[Unit], dropped: int) -> list[int]:
    """Rank 0 checks the directory's identity and finds the unfinished units; all ranks get the
    list (or the same one-line error)."""
    answer: Any = None
    if ctx.is_main:
        try:
            answer = _plan(out, model, job, units, dropped)
        except CorpusError as exc:
            answer = exc
    answer = ctx.all_gather_object(answer)[0]
    if isinstance(answer, CorpusError):
        raise answer
    return answer


def _plan(out: Path, model, job: Job, units: list[Unit], dropped: int) -> list[int]:
    store.check_identity(out, identity(model, job, units))
    store.write_prompts(out, units)
    done, notes = store.finished_units(out, units, len(job.settings.seeds))
    (out / "progress").mkdir(exist_ok=True)
    for old in (out / "progress").glob("rank-*.json"):
        old.unlink()
    for line in notes + (
        [f"{dropped} duplicate prompts dropped (same source and text)"] if dropped else []
    ):
        print(f"corpus: {line}", file=sys.stderr)
    if done:
        print(f"corpus: {len(done)} of {len(units)} units already done, verified", file=sys.stderr)
    return [u.index for u in units if u.index not in done]


def _write_units(
    model, units: list[Unit], settings: Settings, batch_tokens: int, out: Path, ctx, bar
) -> None:
    """Analyse and write the units one part each; a failure stops this rank with one line naming
    the unit (the units finished before it are written)."""
    started = time.perf_counter()
    try:
        for unit, frame in analyse_units(model, units, settings, batch_tokens, bar.tick):
            meta = {
                "seconds": round(time.perf_counter() - started, 3),
                "rank": ctx.rank,
                "tokens": unit.tokens,
                "device": str(model.device),
            }
            try:
                store.write_part(out, unit, frame, meta)
            except Exception as exc:
                raise UnitFailed(unit) from exc
            started = time.perf_counter()
    except UnitFailed as failed:
        exc, unit = failed.__cause__, failed.unit
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CorpusError(
            f"rank {ctx.rank}: unit {unit.index} ({len(unit.prompts)} prompts, first "
            f"{unit.prompts[0].prompt.id}) failed: {type(exc).__name__}: {first}"
        ) from exc


class _Progress:
    """One bar on rank 0 over all ranks' tokens × seeds. Under several ranks each writes its count
    to a progress file (at most every ``every`` seconds, and once at the end), which rank 0 reads;
    one process counts in memory and writes nothing."""

    every = 1.0

    def __init__(self, out: Path, ctx, total: int, show: bool) -> None:
        self.path = out / "progress" / f"rank-{ctx.rank}.json"
        self.ctx, self.done, self.total = ctx, 0, total
        self.written = self.shown = 0.0
        self.bar = tqdm(total=total, desc="corpus", unit="tok", disable=not show, smoothing=0.1)

    def tick(self, tokens: int) -> None:
        self.done += tokens
        now = time.monotonic()
        if self.ctx.distributed and now - self.written >= self.every:
            self._write()
        if now - self.shown >= self.every / 2:
            self._show()

    def _write(self) -> None:
        atomic_write_text(self.path, json.dumps({"done": self.done, "time": time.time()}))
        self.written = time.monotonic()

    def _count(self) -> int:
        """Token runs done by every rank so far."""
        if not self.ctx.distributed:
            return self.done
        total = 0
        for path in self.path.parent.glob("rank-*.json"):
            try:
                total += json.loads(path.read_text())["done"]
            except (OSError, ValueError, KeyError):
                continue
        return total

    def _show(self) -> None:
        self.shown = time.monotonic()
        if not self.bar.disable:
            self.bar.n = min(self.total, self._count())
            self.bar.refresh()

    def finish(self) -> None:
        """Every rank writes its final count; rank 0 keeps the bar moving until all are in."""
        if self.ctx.distributed:
            self._write()
            while self.ctx.is_main and self._count() < self.total:
                self._show()
                time.sleep(0.5)
        self._show()
        self.bar.close()


def run_in_process(model_path: str, make_job, out: str | Path, dtype: str | None = None) -> Path:
    """Load the model on this rank's device, build the job from it (``make_job(model)``: defaults
    such as 4r̄ steps come from the model) and run: the CLI's entry, one rank of a launch."""
    from cluster.context import shutdown

    ctx = rank_context()
    try:
        model = rm.load_model(model_path, device=ctx.device, dtype=_dtype(dtype, ctx.device))
        return run(model, make_job(model), out, ctx=ctx)
    finally:
        shutdown()


def _dtype(name: str | None, device: torch.device) -> torch.dtype | None:
    """bf16 weights on a GPU by default; the checkpoint's own dtype on the CPU."""
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else None
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise CorpusError(f"--dtype must be one of {', '.join(table)}, got {name!r}")
    return table[name]


__all__ = ["Job", "analyse_units", "run", "run_in_process", "rank_context"]
