"""Summaries of a corpus run: shares of each kind by source and token category, the period
histogram, steps to converge by source and difficulty, the tokens most often on orbits, λ_1
quantiles; written as ``DIR/summary.md`` and ``DIR/summary.json``.

A token's kind is counted as the census always counted it: every (prompt, seed, position) row is
one trajectory. ``converging`` (a fixed point that has not settled) is its own column beside
``fixed_point`` so a settled token and a still-moving one are never added up silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recurrent_model.atomic_io import atomic_write_text

from ..dynamics import KINDS
from .store import load, load_prompts, read_manifest

PERIOD_CAP = 16
MIN_OCCURRENCES = 20


def shares(frame: pd.DataFrame, by: str | None) -> pd.DataFrame:
    """Share of each kind (columns), overall or per value of ``by`` (rows), with the token count,
    the share of fixed points that have not settled, and the median final step."""
    if by is None:
        table = frame["kind"].value_counts(normalize=True).to_frame().T
        table.index = ["all"]
        table["tokens"] = len(frame)
    else:
        table = pd.crosstab(frame[by], frame["kind"], normalize="index")
        table["tokens"] = frame[by].value_counts()
    for kind in KINDS:
        if kind not in table:
            table[kind] = 0.0
    fixed = frame[frame["kind"] == "fixed_point"]
    unsettled = ~fixed["settled"].astype(bool)
    table["converging"] = (
        unsettled.sum() / len(frame)
        if by is None
        else unsettled.groupby(fixed[by]).sum() / table["tokens"]
    )
    table["converging"] = table["converging"].fillna(0.0)
    table["tokens"] = table["tokens"].astype(int)
    step = frame["final_step_size"] if by is None else frame.groupby(by)["final_step_size"]
    table["median_final_step"] = step.median()
    return table[[*KINDS, "converging", "tokens", "median_final_step"]]


def period_histogram(frame: pd.DataFrame) -> pd.Series:
    """Orbits by period in steps (rounded; ``PERIOD_CAP`` stands for ≥ PERIOD_CAP)."""
    orbits = frame[frame["kind"] == "orbit"]
    return orbits["period"].round(0).clip(upper=PERIOD_CAP).astype(int).value_counts().sort_index()


def convergence_steps(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    """Steps to converge by ``by``: median, quartiles, and the share that never converged."""
    grouped = frame.groupby(by)["steps_to_converge"]
    return pd.DataFrame(
        {
            "median": grouped.median(),
            "q25": grouped.quantile(0.25),
            "q75": grouped.quantile(0.75),
            "never": grouped.apply(lambda s: float(s.isna().mean())),
            "tokens": grouped.size(),
        }
    )


def orbit_prone_tokens(frame: pd.DataFrame, top: int = 15) -> pd.DataFrame:
    """Tokens (≥ MIN_OCCURRENCES rows) by their share of orbiting rows, most first."""
    table = (
        frame.assign(is_orbit=frame["kind"] == "orbit")
        .groupby("token")["is_orbit"]
        .agg(["mean", "size"])
        .query(f"size >= {MIN_OCCURRENCES}")
        .sort_values("mean", ascending=False)
        .rename(columns={"mean": "orbit_share", "size": "rows"})
    )
    return table.head(top).reset_index()


def runs_by_orbit_share(frame: pd.DataFrame) -> pd.DataFrame:
    """Per group (source, or depth task kind): the share of (prompt, seed) runs whose tokens orbit
    not at all / < 20 % / 20-80 % / > 80 %, and the median position of the first orbiting token
    (is an orbit a property of the context?)."""
    keys = [frame["group"], frame["prompt_id"], frame["seed"]]
    orbit = (frame["kind"] == "orbit").groupby(keys).mean()
    bins = pd.cut(orbit, [-0.01, 0.0, 0.2, 0.8, 1.0], labels=["none", "<20%", "20-80%", ">80%"])
    table = pd.crosstab(orbit.index.get_level_values(0), bins, normalize="index")
    table = table.reindex(columns=list(bins.cat.categories), fill_value=0.0)
    orbits = frame[frame["kind"] == "orbit"]
    first = orbits.groupby(["group", "prompt_id", "seed"])["position"].min()
    table["median_first_orbit_position"] = first.groupby(level=0).median()
    table.index.name = "group"
    return table


def lambda_quantiles(frame: pd.DataFrame) -> pd.DataFrame | None:
    """λ_1 quantiles per source (one value per prompt position: seed 0's rows), with the share of
    neutral tokens; None without the stability analysis."""
    if "lambda_1" not in frame:
        return None
    rows = frame[frame["seed"] == frame["seed"].min()]
    q = rows.groupby("source")["lambda_1"].quantile([0.05, 0.25, 0.5, 0.75, 0.95]).unstack()
    q.columns = [f"q{int(c * 100):02d}" for c in q.columns]
    q["neutral"] = rows.groupby("source")["lambda_1_neutral"].mean()
    q["positive"] = rows.groupby("source")["lambda_1"].apply(lambda s: float((s > 0).mean()))
    return q


def summary(out: str | Path, frame: pd.DataFrame | None = None) -> dict[str, Any]:
    """The summary tables of the corpus run in ``out`` (DataFrames), with the run's identity;
    ``frame``: its rows when already loaded (``load(out)``), else they are read."""
    frame = load(out) if frame is None else frame
    prompts = load_prompts(out).set_index("prompt_id")
    frame = frame.assign(group=frame["prompt_id"].map(prompts["group"]))
    manifest = read_manifest(out)
    tables: dict[str, Any] = {
        "overall": shares(frame, None),
        "by_source": shares(frame, "source"),
        "by_category": shares(frame, "category"),
        "by_group": shares(frame, "group"),
        "by_seed": shares(frame, "seed"),
        "runs_by_orbit_share": runs_by_orbit_share(frame),
        "periods": period_histogram(frame),
        "steps_by_source": convergence_steps(frame, "source"),
        "steps_by_difficulty": convergence_steps(
            frame.dropna(subset=["difficulty"]).assign(
                difficulty=lambda f: f["source"] + ":" + f["difficulty"].astype(int).astype(str)
            ),
            "difficulty",
        )
        if frame["difficulty"].notna().any()
        else pd.DataFrame(),
        "orbit_prone_tokens": orbit_prone_tokens(frame),
        "lambda_1": lambda_quantiles(frame),
    }
    tables["meta"] = {
        "rows": len(frame),
        "prompts": int(frame["prompt_id"].nunique()),
        "seeds": sorted(int(s) for s in frame["seed"].unique()),
        "num_steps": manifest["settings"]["num_steps"],
        "model": manifest["model"]["name"],
        "kind_agrees_across_seeds": _agreement(frame),
    }
    return tables


def _agreement(frame: pd.DataFrame) -> float:
    per = frame.pivot_table(
        index=["prompt_id", "position"], columns="seed", values="kind", aggfunc="first"
    )
    return float((per.nunique(axis=1) == 1).mean())


def markdown(tables: dict[str, Any]) -> str:
    """The summary as Markdown tables."""
    meta = tables["meta"]
    parts = [
        f"Corpus run of {meta['model']} at {meta['num_steps']} steps: {meta['rows']} token "
        f"trajectories ({meta['prompts']} prompts × seeds {meta['seeds']}); a token's kind is the "
        f"same for every seed in {meta['kind_agrees_across_seeds']:.1%} of positions. "
        "`converging` counts fixed points that have not settled (they are inside `fixed_point`).",
    ]
    titled = [
        ("Overall", "overall"), ("By source", "by_source"), ("By task group", "by_group"),
        ("By token category", "by_category"), ("By seed", "by_seed"),
        ("Runs (prompt × seed) by the share of their tokens on orbits", "runs_by_orbit_share"),
        ("Steps to converge by source", "steps_by_source"),
        ("Steps to converge by difficulty", "steps_by_difficulty"),
        ("Tokens most often on orbits", "orbit_prone_tokens"), ("λ_1 by source", "lambda_1"),
    ]  # fmt: skip
    for title, key in titled:
        table = tables[key]
        if table is None or len(table) == 0:
            continue
        index = key != "orbit_prone_tokens"
        counts = {c: table[c].map(str) for c in ("tokens", "rows") if c in table}
        table = table.assign(**counts)  # counts as integers, not in the floats' format
        parts.append(f"{title}:\n\n" + table.to_markdown(index=index, floatfmt=".3g"))
    periods = tables["periods"].rename("orbits").to_frame()
    periods.index.name = f"period (steps, {PERIOD_CAP} = ≥{PERIOD_CAP})"
    parts.append("Orbit periods:\n\n" + periods.to_markdown())
    return "\n\n".join(parts) + "\n"


def write_summary(out: str | Path) -> dict[str, Any]:
    """Write ``summary.md`` and ``summary.json`` beside the run; returns the tables."""
    out = Path(out)
    tables = summary(out)
    atomic_write_text(out / "summary.md", markdown(tables))
    plain = {
        k: (
            v.to_dict()
            if isinstance(v, pd.Series)
            else v.to_dict("index")
            if isinstance(v, pd.DataFrame)
            else v
        )
        for k, v in tables.items()
        if v is not None
    }
    text = json.dumps(_plain(plain), indent=2, allow_nan=False)
    atomic_write_text(out / "summary.json", text + "\n")
    return tables


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars as Python numbers, NaN as null, keys as strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
