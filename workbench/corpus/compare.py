"""Corpus runs compared: the share of each dynamics kind, steps to converge, λ_1 and the lens KL of
two or more runs side by side, per source and overall, with each later run's difference from the
first and a bootstrap interval over prompts.

    frames = workbench.corpus.compare(["runs/r16", "runs/r48"])
    python -m workbench.corpus compare runs/r16 runs/r48 --bootstrap 1000

Every run is measured on the prompts that all runs hold (matched by ``prompt_id``, a hash of source
and text); the others are counted. The resampling unit of the bootstrap is the prompt: a resample
draws the shared prompts with replacement and recomputes each statistic over all rows (every seed
and position) of the drawn prompts, the same draws for every run, so the interval of a difference
carries the correlation between tokens of one prompt and between the runs.

Runs whose tokenizers differ (another vocabulary or tokenizer hash in the manifest, or other token
ids for the same prompt) have no common tokens: then each prompt's rows are first aggregated to
prompt-level statistics (its share of each kind, its median steps) and the prompts are compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..dynamics import LABELS, dynamics_labels
from .sources import CorpusError
from .store import load, read_manifest

LEVEL = 0.95
KIND_NAMES = {"fixed_point": "settled", "converging": "converging", "orbit": "orbit",
              "slider": "slider", "other": "other"}  # fmt: skip
TABLES = ("kinds", "steps", "lambda_1", "lens")
TABLE_COLUMNS = ["group", "statistic", "run", "value", "reference", "difference", "low", "high"]
TITLES = {
    "kinds": "Kinds of token trajectories (share; settled + converging = fixed points)",
    "steps": "Steps to converge (quartiles of those that converged; never: the share that did not)",
    "lambda_1": "λ_1 (the first seed's rows: one trajectory from s_0 = 0 per position)",
    "lens": "Coda-lens KL to each run's own final prediction (median)",
}
ABSENT = {
    "lambda_1": "λ_1: not in every run (the stability analysis), not compared.",
    "lens": "Lens KL: no lens step that every run has, not compared.",
}
QUANTILE_CHUNK = 2_000_000  # weights held at once by the weighted quantile (draws × rows)


@dataclass(frozen=True)
class _Run:
    label: str
    path: Path
    manifest: dict[str, Any]
    frame: pd.DataFrame


@dataclass(frozen=True)
class _Stat:
    """One statistic of a table: a weighted mean of ``column`` (``q`` None) or its ``q`` quantile
    over the non-missing values."""

    table: str
    name: str
    column: str
    q: float | None = None


def compare(
    runs: Sequence[str | Path], n_boot: int = 1000, seed: int = 0
) -> dict[str, pd.DataFrame]:
    """Compare corpus runs: each later run against the first, on the prompts all of them hold.

    Returns ``runs`` (one row per run: label, path, model, num_steps, seeds, ...), ``pairs`` (per
    later run: prompts shared, only in either, whether compared per token or per prompt text and
    why) and one long table per ``TABLES`` entry with columns ``TABLE_COLUMNS``: a row per (group,
    statistic, run) with the run's value and, for later runs, the difference from the first run
    (``reference``) and its bootstrap interval (``LEVEL``). The resampling unit is the prompt:
    ``n_boot`` resamples draw the shared prompts with replacement and recompute each statistic over
    all rows of the drawn prompts (the same draws for every run). A directory that is not a corpus
    run is refused with a ``CorpusError``.
    """
    if isinstance(runs, (str, Path)):
        runs = [runs]
    if len(runs) < 2:
        raise CorpusError(f"compare needs at least two corpus runs, got {len(runs)}")
    if n_boot < 1:
        raise CorpusError(f"--bootstrap must be >= 1, got {n_boot}")
    loaded = [_read_run(Path(p), label) for p, label in zip(runs, _labels(runs))]
    ids = [set(r.frame["prompt_id"].unique()) for r in loaded]
    common = sorted(set.intersection(*ids))
    if not common:
        raise CorpusError(
            f"{loaded[0].label} and the other runs share no prompt (prompt ids hash source and "
            "text: the same file name and lines give the same ids)"
        )
    reasons = [_tokenizer_difference(loaded[0], r, common) for r in loaded[1:]]
    per_prompt = any(reasons)
    pairs = pd.DataFrame(
        {
            "run_a": loaded[0].label,
            "run_b": [r.label for r in loaded[1:]],
            "shared": [len(ids[0] & i) for i in ids[1:]],
            "only_a": [len(ids[0] - i) for i in ids[1:]],
            "only_b": [len(i - ids[0]) for i in ids[1:]],
            "shared_by_all": len(common),
            "unit": "prompt" if per_prompt else "token",
            "tokenizer": [reason or "" for reason in reasons],
            "n_boot": n_boot,
            "level": LEVEL,
        }
    )
    stats = _statistics(loaded)
    observations = [_observations(r, common, per_prompt) for r in loaded]
    tables = _tables(loaded, observations, stats, common, n_boot, seed)
    return {"runs": _run_table(loaded), "pairs": pairs, **tables}


def _labels(runs: Sequence[str | Path]) -> list[str]:
    """Each run's name: its directory name, or the path when two names clash."""
    names = [Path(p).name or str(p) for p in runs]
    if len(set(names)) < len(names):
        names = [str(p) for p in runs]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def _read_run(path: Path, label: str) -> _Run:
    """A corpus run's manifest and rows; anything else is refused in one line."""
    if not path.is_dir():
        raise CorpusError(f"{path} is not a corpus run (not a directory)")
    try:
        manifest = read_manifest(path)
    except ValueError as exc:
        if isinstance(exc, CorpusError):
            raise
        raise CorpusError(f"{path} is not a corpus run (manifest.json is unreadable)") from None
    if not isinstance(manifest, dict) or not {"model", "settings"} <= set(manifest):
        raise CorpusError(f"{path} is not a corpus run (manifest.json has no model and settings)")
    try:
        frame = load(path)
    except (OSError, pa.ArrowException) as exc:
        raise CorpusError(f"{path}: its token rows cannot be read ({type(exc).__name__})") from None
    missing = {"prompt_id", "source", "seed", "position", "token_id", "kind", "settled"}
    missing -= set(frame.columns)
    if missing:
        raise CorpusError(f"{path} is not a corpus run (its rows lack {sorted(missing)})")
    return _Run(label, path, manifest, frame)


def _token_ids(frame: pd.DataFrame, prompts: Sequence[str]) -> pd.Series:
    """Each prompt's token ids (its first seed's rows in position order) as a tuple."""
    rows = frame[(frame["seed"] == frame["seed"].min()) & frame["prompt_id"].isin(prompts)]
    rows = rows.sort_values(["prompt_id", "position"])
    return rows.groupby("prompt_id")["token_id"].agg(tuple)


def _tokenizer_difference(a: _Run, b: _Run, common: Sequence[str]) -> str | None:
    """Why ``a`` and ``b`` cannot be compared token by token (None when they can)."""
    reasons = []
    vocab_a = a.manifest.get("config", {}).get("vocab_size")
    vocab_b = b.manifest.get("config", {}).get("vocab_size")
    if vocab_a != vocab_b:
        reasons.append(f"vocabulary {vocab_a} ≠ {vocab_b}")
    hash_a, hash_b = a.manifest["model"].get("tokenizer"), b.manifest["model"].get("tokenizer")
    if hash_a != hash_b:
        reasons.append("tokenizer hash differs")
    ids_a, ids_b = _token_ids(a.frame, common), _token_ids(b.frame, common)
    differ = sum(ids_a.get(p) != ids_b.get(p) for p in common)
    if differ:
        reasons.append(f"token ids differ for {differ} of {len(common)} shared prompts")
    return "; ".join(reasons) or None


def _statistics(runs: Sequence[_Run]) -> list[_Stat]:
    """The statistics every run can give: kinds and steps always, λ_1 and each common lens step
    where every run has them."""
    stats = [_Stat("kinds", KIND_NAMES[label], f"share:{label}") for label in LABELS]
    stats += [
        _Stat("steps", "median", "steps", 0.5),
        _Stat("steps", "q25", "steps", 0.25),
        _Stat("steps", "q75", "steps", 0.75),
        _Stat("steps", "never", "never"),
    ]
    if all("lambda_1" in r.frame for r in runs):
        stats += [_Stat("lambda_1", name, "lambda_1", q) for name, q in _LAMBDA]
    for step in _common_lens_steps(runs):
        stats.append(_Stat("lens", f"KL at step {step}", f"lens_kl_{step}", 0.5))
    return stats


_LAMBDA = (("q25", 0.25), ("median", 0.5), ("q75", 0.75))


def _common_lens_steps(runs: Sequence[_Run]) -> list[int]:
    steps = [
        {int(c.removeprefix("lens_kl_")) for c in r.frame.columns if c.startswith("lens_kl_")}
        for r in runs
    ]
    return sorted(set.intersection(*steps))


def _observations(run: _Run, common: Sequence[str], per_prompt: bool) -> pd.DataFrame:
    """The values the statistics average or take quantiles of: one row per token row (per
    prompt when ``per_prompt``: each prompt's rows aggregated first), with its prompt and source.

    ``share:LABEL`` is 1/0 per row (``dynamics_labels``, as the summaries count kinds), ``steps``
    is NaN for a token that never converged and ``never`` says so; ``lambda_1`` is kept on the
    first seed's rows only (it is the same trajectory from s_0 = 0 for every seed)."""
    frame = run.frame[run.frame["prompt_id"].isin(common)]
    labels = dynamics_labels(frame).to_numpy()
    out = pd.DataFrame({"prompt_id": frame["prompt_id"].to_numpy(),
                        "group": frame["source"].astype(str).to_numpy()})  # fmt: skip
    for label in LABELS:
        out[f"share:{label}"] = (labels == label).astype(float)
    out["steps"] = frame["steps_to_converge"].to_numpy(dtype=float)
    out["never"] = np.isnan(out["steps"]).astype(float)
    if "lambda_1" in frame:
        first = (frame["seed"] == frame["seed"].min()).to_numpy()
        out["lambda_1"] = np.where(first, frame["lambda_1"].to_numpy(dtype=float), np.nan)
    for column in (c for c in frame.columns if c.startswith("lens_kl_")):
        out[column] = frame[column].to_numpy(dtype=float)
    if not per_prompt:
        return out
    how = {c: "mean" if c.startswith("share:") or c == "never" else "median"
           for c in out.columns if c not in ("prompt_id", "group")}  # fmt: skip
    return out.groupby(["prompt_id", "group"], as_index=False, sort=True).agg(how)


def _tables(
    runs: Sequence[_Run],
    observations: Sequence[pd.DataFrame],
    stats: Sequence[_Stat],
    common: Sequence[str],
    n_boot: int,
    seed: int,
) -> dict[str, pd.DataFrame]:
    """The long tables: per group (all, then each source when there are several) the statistics
    of every run, and each later run's difference from the first with its percentile bootstrap
    interval."""
    sources = observations[0].drop_duplicates("prompt_id").set_index("prompt_id")["group"]
    by_source = [(name, sorted(ids)) for name, ids in sources.groupby(sources).groups.items()]
    groups = [("all", list(common))] + (by_source if len(by_source) > 1 else [])
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    for index, (group, prompts) in enumerate(groups):
        weights = _draws(len(prompts), n_boot, np.random.default_rng([seed, index]))
        position = {p: i for i, p in enumerate(prompts)}
        parts = [o[o["prompt_id"].isin(position)] for o in observations]
        where = [p["prompt_id"].map(position).to_numpy() for p in parts]
        for stat in stats:
            draws = [
                _evaluate(stat, part[stat.column].to_numpy(dtype=float), at, weights)
                for part, at in zip(parts, where)
            ]
            rows[stat.table] += _rows(group, stat, runs, draws)
    return {t: pd.DataFrame(rows[t], columns=TABLE_COLUMNS) for t in TABLES}


def _draws(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Prompt multiplicities (1 + n_boot, n): row 0 all ones (the data), then ``n_boot`` resamples
    of the n prompts with replacement."""
    picks = rng.integers(0, n, size=(n_boot, n)) + n * np.arange(n_boot)[:, None]
    counts = np.bincount(picks.ravel(), minlength=n_boot * n).reshape(n_boot, n)
    return np.vstack([np.ones((1, n), dtype=np.int64), counts])


def _evaluate(
    stat: _Stat, values: np.ndarray, prompt: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """The statistic under every row of ``weights`` (a prompt's rows count its multiplicity)."""
    valid = ~np.isnan(values)
    values, prompt = values[valid], prompt[valid]
    n = weights.shape[1]
    if stat.q is None:
        sums = np.bincount(prompt, weights=values, minlength=n)
        counts = np.bincount(prompt, minlength=n).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (weights @ sums) / (weights @ counts)
    return _weighted_quantile(values, prompt, weights, stat.q)


def _weighted_quantile(
    values: np.ndarray, prompt: np.ndarray, weights: np.ndarray, q: float
) -> np.ndarray:
    """The ``q`` quantile (linear interpolation, as pandas and numpy take it) of ``values`` with
    each value repeated as often as its prompt is drawn, for every row of ``weights``."""
    out = np.full(weights.shape[0], np.nan)
    if len(values) == 0:
        return out
    order = np.argsort(values, kind="stable")
    ordered, owner = values[order], prompt[order]
    chunk = max(1, QUANTILE_CHUNK // len(values))
    for start in range(0, weights.shape[0], chunk):
        cum = np.cumsum(weights[start : start + chunk][:, owner], axis=1)
        total = cum[:, -1]
        h = (total - 1) * q
        lo = np.floor(h)
        hi = np.minimum(lo + 1, total - 1)
        j_lo = np.minimum((cum <= lo[:, None]).sum(axis=1), len(ordered) - 1)
        j_hi = np.minimum((cum <= hi[:, None]).sum(axis=1), len(ordered) - 1)
        a, b = ordered[j_lo], ordered[j_hi]
        value = a + (h - lo) * (b - a)
        out[start : start + chunk] = np.where(total > 0, value, np.nan)
    return out


def _rows(
    group: str, stat: _Stat, runs: Sequence[_Run], draws: Sequence[np.ndarray]
) -> list[dict[str, Any]]:
    """A table row per run: its value; for later runs the difference from the first and the
    percentile interval of the resampled differences."""
    first = draws[0]
    rows = []
    for run, values in zip(runs, draws):
        row = {"group": group, "statistic": stat.name, "run": run.label, "value": values[0],
               "reference": "", "difference": np.nan, "low": np.nan, "high": np.nan}  # fmt: skip
        if run is not runs[0]:
            delta = values - first
            resampled = delta[1:][np.isfinite(delta[1:])]
            tail = 100 * (1 - LEVEL) / 2
            low, high = (
                np.percentile(resampled, [tail, 100 - tail]) if len(resampled) else (np.nan,) * 2
            )
            row.update(reference=runs[0].label, difference=delta[0], low=low, high=high)
        rows.append(row)
    return rows


def _run_table(runs: Sequence[_Run]) -> pd.DataFrame:
    """One row per run: its label, directory and what the manifest says it ran."""
    rows = []
    for run in runs:
        settings = run.manifest.get("settings", {})
        rows.append(
            {
                "run": run.label,
                "path": str(run.path),
                "model": str(run.manifest["model"].get("name", "?")),
                "num_steps": int(settings.get("num_steps", -1)),
                "seeds": ",".join(str(s) for s in settings.get("seeds", [])),
                "analyses": ",".join(settings.get("analyses", [])),
                "lens_steps": ",".join(str(s) for s in settings.get("lens_steps", [])),
                "vocab_size": int(run.manifest.get("config", {}).get("vocab_size", -1)),
                "prompts": int(run.frame["prompt_id"].nunique()),
                "rows": len(run.frame),
            }
        )
    return pd.DataFrame(rows)


def format_comparison(frames: dict[str, pd.DataFrame]) -> str:
    """The comparison as text: the runs, the prompts they share, one table per statistic with
    each later run's difference and interval, and a footer naming the resampling unit."""
    runs, pairs = frames["runs"], frames["pairs"]
    first = runs["run"].iloc[0]
    shown = runs[["run", "model", "num_steps", "seeds", "analyses", "prompts", "rows"]]
    parts = [
        f"Corpus runs compared ({len(runs)}; each later run against {first}):\n\n"
        + shown.to_markdown(index=False),
        "\n".join(_pair_line(p) for p in pairs.itertuples()),
    ]
    if (pairs["unit"] == "prompt").any():
        why = "; ".join(f"{p.run_b}: {p.tokenizer}" for p in pairs.itertuples() if p.tokenizer)
        parts[-1] += (
            f"\nTokenizers differ ({why}): compared per prompt text, each prompt's rows "
            "aggregated first (mean share per kind, median steps, median λ_1 and lens KL)."
        )
    for table in TABLES:
        parts.append(_format_table(table, frames[table]))
    n_boot, shared = int(pairs["n_boot"].iloc[0]), int(pairs["shared_by_all"].iloc[0])
    per_prompt = (pairs["unit"] == "prompt").any()
    brings = "its prompt-level values" if per_prompt else "all its rows: every seed and position"
    parts.append(
        f"Δ: each later run minus {first}, over the {shared} prompts every run holds (statistics "
        f"over {'prompts' if per_prompt else 'token rows'}). Intervals: {LEVEL:.0%} percentile "
        f"bootstrap, {n_boot} resamples; the resampling unit is the prompt (a drawn prompt brings "
        f"{brings}), the same draws for every run."
    )
    return "\n\n".join(parts) + "\n"


def _pair_line(pair: Any) -> str:
    return (
        f"{pair.run_b} vs {pair.run_a}: {pair.shared} prompts in both; "
        f"{pair.only_a} prompts only in {pair.run_a}, {pair.only_b} only in {pair.run_b}."
    )


def _format_table(name: str, table: pd.DataFrame) -> str:
    """One table as Markdown: a column per run, then a Δ column per later run."""
    if table.empty:
        return ABSENT[name]
    fmt = ".3f" if name == "kinds" else ".4g"
    keys = list(dict.fromkeys(zip(table["group"], table["statistic"])))
    runs = list(dict.fromkeys(table["run"]))
    by = table.set_index(["group", "statistic", "run"])
    out = pd.DataFrame({"group": [k[0] for k in keys], "statistic": [k[1] for k in keys]})
    for run in runs:
        out[run] = [_number(by.loc[(*k, run), "value"], fmt) for k in keys]
    for run in runs[1:]:
        ref = by.loc[(*keys[0], run), "reference"]
        out[f"Δ {run} − {ref} [{LEVEL:.0%}]"] = [_delta(by.loc[(*k, run)], fmt) for k in keys]
    return f"{TITLES[name]}:\n\n" + out.to_markdown(index=False)


def _number(value: float, fmt: str) -> str:
    return "–" if not np.isfinite(value) else format(value, fmt)


def _delta(row: pd.Series, fmt: str) -> str:
    if not np.isfinite(row["difference"]):
        return "–"
    sign = "+" + fmt
    interval = (
        f" [{format(row['low'], sign)}, {format(row['high'], sign)}]"
        if np.isfinite(row["low"])
        else ""
    )
    return format(row["difference"], sign) + interval
