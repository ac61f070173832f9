"""Dynamics across training: the saved checkpoints of a run analysed in step order.

For every checkpoint ``step-NNNNNNN`` of a run (under ``run_dir/checkpoints/`` as the trainer writes
them, or directly under ``run_dir``) it measures, on the same texts:

- next-token loss at each depth in ``depths`` (does the model learn to use its recurrence, and when?);
- at ``num_steps`` iterations: the shares of fixed points / orbits / sliders / other over all tokens
  (``classify_dynamics``), the path-independence spread of the final state over ``seeds`` and the mean
  token correlation of the final state (the collapse diagnostic);
- the training loss the run logged at that step (``metrics.jsonl``, read as plain JSON), if present.

Checkpoints are read through ``recurrent_model.load_model``; nothing from the training code is imported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import recurrent_model as rm

from .collect import collect
from .core_map import CoreMap, initial_state
from .dynamics import classify_dynamics, label_shares
from .lyapunov import token_exponent_table
from .path_independence import path_independence
from .token_correlation import token_correlation

STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete ``step-N`` checkpoint of a run, in step order."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    base = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    found = []
    for path in base.iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir() and (path / "config.json").is_file():
            found.append((int(match.group(1)), path))
    if not found:
        raise FileNotFoundError(f"no step-N checkpoint directories with a config.json in {base}")
    return sorted(found)


def logged_losses(run_dir: str | Path) -> dict[int, float]:
    """Training loss by step from ``run_dir/metrics.jsonl`` (empty if the file is absent)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            if "step" in record and "loss" in record:
                out[int(record["step"])] = float(record["loss"])
    return out


@torch.no_grad()
def _loss(model: rm.RecurrentLM, rows: Sequence[list[int]], depth: int, seed: int) -> float:
    total, count = 0.0, 0
    for i, ids in enumerate(rows):
        x = torch.tensor([ids])
        g = torch.Generator().manual_seed(seed + i)
        out = model(x[:, :-1], num_steps=depth, labels=x[:, 1:], generator=g)
        total += float(out.loss) * (len(ids) - 1)
        count += len(ids) - 1
    return total / count


def checkpoint_metrics(
    model: rm.RecurrentLM,
    texts: Sequence[str],
    depths: Sequence[int],
    num_steps: int,
    seeds: Sequence[int] = (0, 1, 2),
    stability: bool = False,
) -> tuple[dict[int, float], dict[str, float]]:
    """Loss by depth, and the dynamics/spread/correlation summary at ``num_steps``, for one model.

    ``stability`` adds ``lambda_1_mean``/``lambda_1_max`` (every token's block λ_1 along its
    trajectory from the first seed's s_0), ``lambda_1_max_stderr`` (the largest one's error),
    ``share_stable`` (the share with λ_1 < 0) and ``share_neutral`` (λ_1 within its error of 0).
    """
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("the checkpoint has no tokenizer.json, so texts cannot be encoded")
    rows = [tokenizer.encode(t)[: model.config.block_size + 1] for t in texts]
    if any(len(r) < 2 for r in rows):
        raise ValueError("every text must encode to at least 2 tokens")
    losses = {int(d): _loss(model, rows, int(d), seed=0) for d in depths}
    kinds, spreads, correlations, exponents = [], [], [], []
    for ids in rows:
        if stability:
            core = CoreMap.from_model(model, ids)
            start = initial_state(model, core, 1.0, seeds[0])
            exponents.append(token_exponent_table(core, start, num_steps))
        states = collect(model, ids, num_steps, seeds=seeds, progress=False).states
        kinds.append(classify_dynamics(states[0]))
        final = path_independence(states)
        spreads.append(float(final.loc[final["step"] == num_steps, "spread"].mean()))
        correlations.append(float(token_correlation(states[0])["correlation"].iloc[-1]))
    summary = {f"share_{k}": share for k, share in label_shares(kinds).items()}
    summary["spread"] = float(np.mean(spreads))
    summary["token_correlation"] = float(np.mean(correlations))
    if stability:
        summary.update(exponent_summary(pd.concat(exponents, ignore_index=True)))
    return losses, summary


def exponent_summary(table: pd.DataFrame) -> dict[str, float]:
    """λ_1 mean, max (with its error), and the stable and neutral shares of a token exponent table."""
    lambdas, top = table["exponent"].to_numpy(), int(table["exponent"].to_numpy().argmax())
    return {"lambda_1_mean": float(lambdas.mean()), "lambda_1_max": float(lambdas[top]),
            "lambda_1_max_stderr": float(table["stderr"].iloc[top]),
            "share_stable": float((lambdas < 0).mean()),
            "share_neutral": float(table["neutral"].mean())}  # fmt: skip


def checkpoint_series(
    run_dir: str | Path,
    texts: Sequence[str],
    depths: Sequence[int] | None = None,
    num_steps: int | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    steps: Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    stability: bool = False,
) -> pd.DataFrame:
    """Analyse the checkpoints of a training run in step order on ``texts``.

    Returns one row per (checkpoint, depth): ``step``, ``depth``, ``loss`` (mean next-token loss of
    ``texts`` at that depth, s_0 seeded), ``gain`` (1 − loss / loss at the smallest depth), and per
    checkpoint (repeated on its rows) ``share_fixed_point`` (settled), ``share_converging`` (a fixed
    point not settled yet), ``share_orbit``, ``share_slider``, ``share_other`` (the labels of
    ``dynamics.dynamics_labels``, as the app's Dynamics tab shows them, first seed), ``spread`` and
    ``token_correlation`` measured at ``num_steps`` from a random s_0 (init_scale 1), plus
    ``train_loss`` from metrics.jsonl (NaN if not logged). ``depths`` defaults to 1, 2, 4, r̄, 2r̄,
    4r̄ of the first checkpoint, ``num_steps`` to 4r̄; ``steps`` picks a subset of checkpoints.
    ``progress(done, total)`` is called after each checkpoint. ``stability`` adds ``lambda_1_mean``,
    ``lambda_1_max`` and ``share_stable`` (tokens whose block λ_1 < 0) at ``num_steps``; it costs
    about one JVP per iteration more, so it is off unless asked for.
    """
    if not texts:
        raise ValueError("texts is empty: give the texts to measure loss and dynamics on")
    found = checkpoint_dirs(run_dir)
    if steps is not None:
        wanted = set(int(s) for s in steps)
        missing = wanted - {s for s, _ in found}
        if missing:
            raise ValueError(f"no checkpoint for step(s) {sorted(missing)} in {run_dir}")
        found = [(s, p) for s, p in found if s in wanted]
    train_losses = logged_losses(run_dir)
    frames = []
    for done, (step, path) in enumerate(found, start=1):
        model = rm.load_model(path)
        r = model.config.mean_recurrence
        run_depths = sorted(set(depths or (1, 2, 4, r, 2 * r, 4 * r)))
        losses, summary = checkpoint_metrics(
            model, texts, run_depths, num_steps or 4 * r, seeds, stability=stability
        )
        frame = pd.DataFrame({"step": step, "depth": list(losses), "loss": list(losses.values())})
        frame["gain"] = 1 - frame["loss"] / frame["loss"].iloc[0]
        for key, value in summary.items():
            frame[key] = value
        frame["train_loss"] = train_losses.get(step, np.nan)
        frames.append(frame)
        if progress is not None:
            progress(done, len(found))
    return pd.concat(frames, ignore_index=True)
