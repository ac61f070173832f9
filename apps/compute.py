"""Cached computations behind the app: the model (st.cache_resource), trajectories and analyses
(st.cache_data). Every analysis is a workbench call; this module only caches and keys them.

Cached calls are ``@cached_analysis`` (``apps/cached.py``): their key is the ``cache_key`` of the
model (set by ``load``: path, device, dtype and the checkpoint's signature), of the trajectory
(set by ``trajectory``: the model's key and the RunSettings) or of a ``CheckpointRun`` (its path
and checkpoints), so a rerun that only changes a view recomputes nothing and a changed input cannot
hit a stale entry.
"""

from __future__ import annotations

import gc
import io
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st
import torch

import recurrent_model
import workbench
from recurrent_model import speed
from recurrent_model.speed import Speed
from recurrent_model.standin import DEFAULT_CHECKPOINT, default_model
from recurrent_model.threads import SINGLE_THREAD_PARAMS, single_thread, threads_for
from workbench._frames import token_display_strings
from workbench.checkpoint_series import checkpoint_dirs
from workbench.dynamics import rotation_plane

from . import cost, umap_worker
from .cached import cache_key, cached_analysis, with_key
from .inputs import RunSettings
from .progress import CollectProgress, TaskProgress


def checkpoint_signature(path: Path) -> str:
    """Names, sizes and modification times of the files in ``path``: changes when it is rewritten."""
    if not path.is_dir():
        return "missing"
    files = sorted(p for p in path.iterdir() if p.is_file())
    return ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)


class ModelSlot:
    """The one model the app keeps in memory. Loading another (checkpoint, device or dtype) drops
    this one and collects it before the next is read, so the peak holds one model, not two."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.model: recurrent_model.RecurrentLM | None = None
        self.lock = threading.Lock()

    def get(self, key: tuple, build: Callable[[], recurrent_model.RecurrentLM]):
        with self.lock:
            if self.key != key:
                self.key, self.model = None, None
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self.model = build()
                self.key = key
            return self.model


@st.cache_resource(show_spinner=False)
def model_slot() -> ModelSlot:
    return ModelSlot()


def load(path: str, device: str, dtype: str | None, signature: str) -> recurrent_model.RecurrentLM:
    """The model at ``path`` in ``dtype`` (None: the checkpoint's own), from the one-model slot;
    the labelled random stand-in when the default checkpoint is missing."""

    def build() -> recurrent_model.RecurrentLM:
        with st.spinner(f"Loading the model ({dtype or 'its own dtype'}) …", show_time=True):
            default = Path(path) == DEFAULT_CHECKPOINT
            if default and not (DEFAULT_CHECKPOINT / "config.json").is_file():
                return default_model(None, device=device, dtype=dtype)
            return recurrent_model.load_model(path, device=device, dtype=dtype)

    model = model_slot().get((path, device, dtype, signature), build)
    return with_key(model, f"{path}|{device}|{dtype}|{signature}")


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes the model's parameters and buffers occupy (each tensor once, tied weights too)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def resident_bytes() -> tuple[int, str]:
    """This process's memory as measured: resident now (/proc/self/statm on Linux), else its
    peak resident size (``resource``), with the word for which one it is."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), "resident"
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak * (1 if sys.platform == "darwin" else 1024), "at most resident"


@cached_analysis(keyed=("model",), max_entries=4)
def trajectory(
    model, run: RunSettings, _progress: CollectProgress | None = None
) -> workbench.Trajectory:
    """Collect s_0 … s_r for every seed (workbench.collect); the normalised view computed once.

    With ``_progress`` a progress bar follows every run and iteration (see CollectProgress), and
    every torch call is a point where Stop ends the collection."""
    watch = ExitStack()
    if _progress is not None:
        _progress.start()
        watch.enter_context(_progress.watching(model))
        watch.enter_context(_progress.ticking())  # a batch of runs makes each block call long
    with threads_for(model), watch:
        traj = workbench.collect(
            model,
            list(run.token_ids),
            run.num_steps,
            seeds=run.seeds,
            init_scale=run.init_scale,
            progress=False,
            on_progress=_progress,
        )
    if _progress is not None:
        _progress.finish()
    traj.normalized_states  # noqa: B018 - computed now so that cache hits carry it
    return with_key(traj, (cache_key(model), run))


def measured_speed(model, rows: int) -> Speed:
    """This machine's F.linear speed on the model's own weights for ``rows`` token states, with
    the model's thread settings (``recurrent_model.speed``: measured again when stale)."""
    with threads_for(model):
        return speed.linear_speed(model, max(1, rows))


def call_seconds(model) -> float:
    """Seconds one block call costs beyond its matmuls here, with the model's thread settings."""
    with threads_for(model):
        return speed.call_overhead(str(model.device), model.dtype).seconds


def estimate_flops(
    model, flops: float, rows: int, calls: int = 0, action: str = "", extra_seconds: float = 0.0
) -> cost.CostEstimate:
    """The estimated time of ``flops`` and ``calls`` block calls on this device, at the speed of
    F.linear on ``rows`` token states (a heavy action's batch), plus ``extra_seconds`` of other
    work, calibrated by the last run of ``action`` on this model (none when ``action`` is empty)."""
    dtype = str(model.dtype).removeprefix("torch.")
    ratio = cost.CALIBRATION.ratio(model, action) if action else 1.0
    guess = cost.estimate(
        flops, measured_speed(model, rows), calls, call_seconds(model) if calls else 0.0,
        cost.default_overhead(str(model.device), dtype), ratio, extra_seconds,
    )  # fmt: skip
    if not action:
        return guess
    return replace(
        guess, on_done=cost.CALIBRATION.recorder(model, action, guess.uncalibrated_seconds)
    )


def estimate(model, tokens: int, num_steps: int, runs: int) -> cost.CostEstimate:
    """The estimated cost of a collection of ``runs`` runs on this device (see apps/cost.py)."""
    config = model.config
    return estimate_flops(
        model,
        cost.forward_flops(config, tokens, num_steps, runs),
        rows=tokens * max(1, min(runs, cost.COLLECT_BATCH)),
        calls=cost.collection_calls(config, num_steps, runs),
        action="collect",
    )


def prompt_then_steps(
    model, action: str, prompt: tuple[float, int, int], steps: tuple[float, int, int]
) -> cost.CostEstimate:
    """One estimate of a prefill and the steps after it, each (FLOPs, rows, block calls) at the
    F.linear speed of its own rows (the prompt's tokens, then the few positions of each step),
    calibrated as one ``action``."""
    parts = [estimate_flops(model, flops, rows, calls) for flops, rows, calls in (prompt, steps)]
    both = cost.combine(parts)
    ratio = cost.CALIBRATION.ratio(model, action)
    recorder = cost.CALIBRATION.recorder(model, action, both.seconds)
    return replace(both, seconds=ratio * both.seconds, calibration=ratio, on_done=recorder)


def generation_estimate(
    model, tokens: int, new_tokens: int, num_steps: int, runs: int = 1, action: str = "generation"
) -> cost.CostEstimate:
    """The estimated time of ``runs`` generations of ``new_tokens`` after a ``tokens``-token prompt
    at ``num_steps`` iterations (no early exit), calibrated as one ``action``: each prompt at the
    speed of F.linear over its tokens, each new token at that of one row."""
    config = model.config
    prompt = cost.forward_flops(config, tokens, num_steps)
    decode = cost.generation_flops(config, tokens, new_tokens, num_steps) - prompt
    return prompt_then_steps(
        model, action, (runs * prompt, tokens, runs * cost.forward_calls(config, num_steps)),
        (runs * decode, 1, runs * cost.forward_calls(config, num_steps, new_tokens)),
    )  # fmt: skip


def diffusion_estimate(
    model, tokens: int, new: int, num_steps: int, inner: int, headway: int
) -> cost.CostEstimate:
    """The estimated time of one diffusion sampling (see cost.diffusion_flops): the prefill at
    the speed of F.linear over the prompt, the sampler's passes at that over the wave."""
    config = model.config
    prefill = cost.forward_flops(config, tokens, num_steps)
    passes = cost.diffusion_flops(config, tokens, new, num_steps, inner, headway) - prefill
    prefill_calls = cost.forward_calls(config, num_steps)
    calls = cost.diffusion_calls(config, new, num_steps, inner, headway) - prefill_calls
    wave = cost.diffusion_wave(new, num_steps, inner, headway)
    return prompt_then_steps(
        model, "diffusion", (prefill, tokens, prefill_calls), (passes, wave, calls)
    )


@cached_analysis(keyed=("model",), max_entries=16, show_spinner="Measuring this device's speed …")
def run_defaults(model, tokens: int) -> tuple[int, int]:
    """Default (steps, number of seeds) whose estimated collection fits `cost.TIME_BUDGET_S`."""
    return cost.default_run(lambda steps, runs: estimate(model, tokens, steps, runs).seconds)


@cached_analysis(keyed=("traj",), max_entries=16)
def pca(traj, all_seeds: bool = False, n_components: int = 6):
    """One PCA over all states (seed 0, or every seed); coordinates and explained variance ratios."""
    states = traj.states if all_seeds else traj.states[0]
    coords, model = workbench.project(states, "pca", n_components=n_components)
    return coords, np.asarray(model.explained_variance_ratio_)


def fit_in_worker(request: tuple[str, object], progress: TaskProgress | None):
    """A UMAP fit in apps.umap_worker's process; with ``progress`` a bar follows the estimate
    (umap reports no progress) and Stop kills the process, which frees its CPU at once."""
    if progress is None:
        return umap_worker.WORKER.fit(request, lambda: None)
    progress.start()
    coords = umap_worker.WORKER.fit(request, progress.tick_clock)
    progress.finish()
    return coords


@cached_analysis(keyed=("traj",), max_entries=4)
def umap(traj, _progress: TaskProgress | None = None) -> np.ndarray:
    """UMAP coordinates (steps + 1, T, 2) of seed 0, fitted on its first 50 principal components
    (in the UMAP process, see fit_in_worker)."""
    return fit_in_worker(("umap", traj.states[0]), _progress)


@cached_analysis(keyed=("traj",), max_entries=8)
def aligned_umap(traj, position: int, _progress: TaskProgress | None = None) -> list[np.ndarray]:
    """One token's trajectories of every run as aligned UMAP embeddings (steps + 1, 2) each
    (in the UMAP process, see fit_in_worker)."""
    runs = [traj.states[k][:, position] for k in range(traj.n_runs)]
    return fit_in_worker(("aligned", runs), _progress)


@cached_analysis(keyed=("traj",), max_entries=16)
def convergence(traj, _tokens: list[str]) -> pd.DataFrame:
    return workbench.convergence(traj.states[0], tokens=_tokens)


@cached_analysis(keyed=("traj",), max_entries=16)
def steps_to_converge(traj, _tokens: list[str], eps: float) -> pd.DataFrame:
    return workbench.steps_to_converge(convergence(traj, _tokens), eps=eps)


@cached_analysis(keyed=("traj",), max_entries=16)
def step_dynamics(traj, _tokens: list[str]) -> pd.DataFrame:
    return workbench.step_dynamics(traj.states[0], tokens=_tokens)


@cached_analysis(keyed=("traj",), max_entries=16)
def token_correlation(traj) -> pd.DataFrame:
    return workbench.token_correlation(traj.states[0])


@cached_analysis(keyed=("traj",), max_entries=16)
def path_independence(traj, _tokens: list[str]) -> pd.DataFrame:
    return workbench.path_independence(traj.states, tokens=_tokens)


@cached_analysis(keyed=("traj",), max_entries=16)
def attractor_distance(traj, _tokens: list[str]) -> pd.DataFrame:
    window = min(16, max(1, traj.num_steps // 2))
    return workbench.attractor_distance(traj.states, window=window, tokens=_tokens)


@cached_analysis(
    keyed=("traj",), max_entries=16, show_spinner="Classifying the dynamics of every token …"
)
def dynamics(traj, _tokens: list[str], run: int = 0) -> pd.DataFrame:
    frame = workbench.classify_dynamics(traj.states[run])
    frame.insert(1, "token_text", _tokens)
    return frame


@cached_analysis(keyed=("traj",), max_entries=64)
def plane(traj, position: int, run: int = 0) -> np.ndarray:
    """The dominant rotation plane (2, h) of one token's trajectory."""
    return rotation_plane(traj.states[run][:, position])


#: A lens chunk's FLOPs at most (one state at least): at a large model's size a chunk of the
#: default 256 MiB of logits would run for minutes between two of the bar's updates.
LENS_CHUNK_FLOPS = 2e10
LENS_CHUNK_BYTES = 2**28  # workbench.lens's own default


def lens_chunk_bytes(config, tokens: int, kind: str) -> int:
    """The ``chunk_bytes`` that keeps a lens chunk within LENS_CHUNK_FLOPS (the default where
    that already holds, so a small model's lens keeps the default chunking)."""
    states = max(1, int(LENS_CHUNK_FLOPS // cost.lens_flops(config, tokens, 0, kind)))
    return min(LENS_CHUNK_BYTES, states * tokens * config.vocab_size * 4 * 3)


@cached_analysis(keyed=("traj",), max_entries=8)
def lens(
    _model,
    traj,
    _tokens: list[str],
    kind: str,
    _progress: TaskProgress | None = None,
) -> pd.DataFrame:
    """The lens on every state of seed 0, in chunks of at most LENS_CHUNK_FLOPS; with
    ``_progress`` a bar follows the states decoded, every torch call is a stop point, and the
    time calibrates the next lens estimate."""
    raw = traj.raw_states[0]
    watch = ExitStack()
    if _progress is not None:
        _progress.start()
        # the last state is decoded first (the final prediction), then every state s_0 … s_r
        coda = getattr(getattr(_model, "transformer", None), "coda", None)
        head = [*(coda[-1:] if coda else ()), _model.lm_head]
        watch.enter_context(_progress.counting_rows(head, raw.shape[0] + 1))
        watch.enter_context(_progress.ticking())
    chunk = lens_chunk_bytes(_model.config, raw.shape[1], kind)
    with threads_for(_model), watch:
        frame = workbench.lens(_model, raw, kind=kind, tokens=_tokens, chunk_bytes=chunk)
    if _progress is not None:
        _progress.finish()
    return frame


@cached_analysis(keyed=("model",), max_entries=8)
def generation(
    model,
    token_ids: tuple[int, ...],
    max_new_tokens: int,
    num_steps: int,
    exit_criterion: str | None,
    exit_threshold: float | None,
    init_scale: float,
    _progress: TaskProgress | None = None,
) -> dict:
    """Greedy generation with an optional adaptive exit: text, tokens and iterations per token.

    With ``_progress`` a bar follows every generated token, and every block call (the prompt's
    too) is a point where Stop ends the generation."""
    ids = torch.tensor([token_ids], dtype=torch.long, device=model.device)
    done = [0]

    def streamer(tokens: torch.Tensor, steps: torch.Tensor) -> None:
        done[0] += 1
        if _progress is not None:
            _progress(done[0], max_new_tokens)

    watch = nullcontext()
    if _progress is not None:
        _progress.start()
        watch = _progress.watching(model)  # the prompt's forward stops at a block too
    with threads_for(model), watch:
        out = model.generate(
            ids,
            max_new_tokens,
            num_steps=num_steps,
            exit_criterion=exit_criterion,
            exit_threshold=exit_threshold,
            init_scale=init_scale,
            return_details=True,
            streamer=streamer,
        )
    if _progress is not None:
        _progress.finish()
    new = out.sequences[0, len(token_ids) :].tolist()
    steps = out.steps[0].tolist()
    n = sum(1 for s in steps if s > 0)  # tokens after a stop token get 0 steps
    tok = model.tokenizer
    return {
        "text": tok.decode(new[:n]),
        "table": pd.DataFrame(
            {"position": range(n), "token": token_display_strings(tok, new[:n]), "steps": steps[:n]}
        ),
        "mean_steps": out.mean_steps,
    }


@cached_analysis(keyed=("model",), max_entries=8)
def diffusion_run(
    model,
    token_ids: tuple[int, ...],
    max_new_tokens: int,
    num_steps: int,
    inner_recurrence: int,
    headway: int,
    exit_t: float,
    freeze_strategy: str,
    init_scale: float,
    _progress: TaskProgress | None = None,
) -> dict:
    """Greedy diffusion sampling: text, the wavefront frames and the summary counts; with
    ``_progress`` a bar follows the frozen tokens, every block call of a pass is a stop point,
    and the time calibrates the next estimate."""
    ids = torch.tensor([token_ids], dtype=torch.long, device=model.device)
    frozen = [0]

    def streamer(tokens: torch.Tensor, steps: torch.Tensor) -> None:
        frozen[0] += int(tokens.numel())
        if _progress is not None:
            _progress(min(frozen[0], max_new_tokens), max_new_tokens)

    watch = nullcontext()
    if _progress is not None:
        _progress.start()
        watch = _progress.watching(model)
    with threads_for(model), watch:
        out = model.generate_diffusion(
            ids, max_new_tokens, num_steps=num_steps, inner_recurrence=inner_recurrence,
            headway=headway, exit_t=exit_t, freeze_strategy=freeze_strategy,
            init_scale=init_scale, max_diffusion_steps=4 * max_new_tokens * num_steps,
            return_details=True, streamer=streamer,
        )  # fmt: skip
    if _progress is not None:
        _progress.finish()
    tok = model.tokenizer
    new = out.sequences[0, len(token_ids) :].tolist()
    frame = workbench.wavefront_frame(out)
    shown = sorted(set(frame["token"].tolist()))
    return {
        "text": tok.decode(new) if tok is not None else " ".join(map(str, new)),
        "frame": frame,
        "frontier": workbench.frontier_frame(out),
        "token_text": dict(zip(shown, token_display_strings(tok, shown)))
        if tok is not None
        else None,
        "summary": out.summary,
        "new_tokens": len(new),
    }


def series_signature(run_dir: Path) -> str:
    """Step numbers and config mtimes of the run's checkpoints: changes when a checkpoint is added."""
    return ";".join(
        f"{s}:{(p / 'config.json').stat().st_mtime_ns}" for s, p in checkpoint_dirs(run_dir)
    )


@dataclass(frozen=True)
class CheckpointRun:
    """A training run's directory of checkpoints, keyed by its path and ``series_signature``,
    read from the files whenever a cached call is made."""

    path: Path

    @property
    def cache_key(self) -> tuple[str, str]:
        return str(self.path), series_signature(self.path)


@cached_analysis(keyed=("series",), max_entries=4)
def checkpoint_series(
    series: CheckpointRun,
    text: str,
    num_steps: int,
    seeds: tuple[int, ...],
    stability: bool = False,
    _progress: TaskProgress | None = None,
) -> pd.DataFrame:
    """`workbench.checkpoint_series` of one prompt (with λ_1 and the share of stable tokens when
    ``stability``), with a progress bar per checkpoint (``_progress``, or a plain one), on one
    thread for small models (see recurrent_model.threads)."""
    run_dir = str(series.path)
    what = "λ_1 of every checkpoint" if stability else "Analysing the checkpoints"
    if _progress is None:
        bar = st.progress(0.0, text=f"{what} …")

        def progress(done: int, total: int) -> None:
            bar.progress(done / total, text=f"{what}: {done} of {total} checkpoints")
    else:
        _progress.start()
        progress = _progress
    found = checkpoint_dirs(run_dir)
    config = recurrent_model.RecurrentConfig.from_json(found[0][1] / "config.json")
    ticks = nullcontext() if _progress is None else _progress.ticking()
    with single_thread(config.cost.parameters < SINGLE_THREAD_PARAMS), ticks:
        frame = workbench.checkpoint_series(
            run_dir, [text], num_steps=num_steps, seeds=seeds, progress=progress,
            stability=stability,
        )  # fmt: skip
    if _progress is None:
        bar.empty()
    else:
        _progress.finish()
    return frame


@cached_analysis(keyed=("traj",), max_entries=4)
def trajectory_file(traj) -> bytes:
    """The trajectory as a safetensors file (Trajectory.save), for the download button."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trajectory.safetensors")
        traj.save(path)
        return Path(path).read_bytes()


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """A DataFrame as CSV bytes (list-valued cells written as their text)."""
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue().encode()
