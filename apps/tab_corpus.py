"""The Corpus tab: a corpus run's result directory (``python -m workbench.corpus run``) as figures
and a filterable token table. Choosing a row opens that prompt, at that position, in the other tabs.

Opening a directory reads Parquet files and runs no model, so there is no Run button.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from recurrent_model.standin import REPO_ROOT
from workbench import corpus, figures
from workbench._frames import printable, token_display_strings
from workbench.corpus.store import MANIFEST

from .cached import cached_analysis
from .inputs import MAX_SEEDS, MAX_STEPS
from .tab_dynamics import SHOWN_KINDS, shown_kinds
from .ui import Context, chart, quoted_tokens, table_download

DEFAULT_DIR = "runs/corpus"
MAX_ROWS = 2000  # the table shows at most this many of the filtered rows
PROMPT_WIDTH = 40  # characters of a prompt's text shown in the table
# the token pickers of the other tabs: one position each, and the Trajectories tab's several
SINGLE_PICKERS = (
    "dyn_token", "stab_token", "lens_token", "pi_token", "patch_position", "steer_plane_token",
    "ablate_token",
)  # fmt: skip
MULTI_PICKERS = ("traj_tokens",)
TABLE_COLUMNS = (
    "source", "prompt", "seed", "position", "token", "kind", "period", "category",
    "steps_to_converge", "final_step_size", "difficulty", "lambda_1", "prompt_id",
)  # fmt: skip


@dataclass
class CorpusRun:
    """A result directory as the tab shows it: the token table, the summary and the manifest."""

    table: pd.DataFrame
    tables: dict[str, Any]
    manifest: dict[str, Any]
    texts: dict[str, str]


def is_corpus_dir(path: Path) -> bool:
    """Whether ``path`` holds a corpus run's manifest (not a checkpoint's or a data build's)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"model", "settings", "data"} <= set(manifest)


def default_dir(root: Path = REPO_ROOT) -> str:
    """``runs/corpus`` when it holds a corpus run, else the newest corpus run directory up to two
    levels under ``runs/``, else ``runs/corpus``."""
    runs = root / "runs"
    if is_corpus_dir(runs / "corpus"):
        return DEFAULT_DIR
    found = [
        path.parent
        for pattern in ("*/manifest.json", "*/*/manifest.json")
        for path in runs.glob(pattern)
        if is_corpus_dir(path.parent)
    ]
    if not found:
        return DEFAULT_DIR
    newest = max(found, key=lambda p: (p / MANIFEST).stat().st_mtime)
    return str(newest.relative_to(root))


def resolve_dir(text: str) -> Path:
    """The typed directory; a relative path is taken from the repository root."""
    path = Path(text.strip()).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def run_signature(path: Path) -> str:
    """Names, sizes and modification times of the run's files: changes when a part is added."""
    files = [path / MANIFEST, path / "prompts.parquet"]
    files += sorted((path / "tokens").glob("part-*.parquet"))
    return ";".join(
        f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files if p.exists()
    )


def same_model(manifest: dict[str, Any], model: Any) -> bool:
    """Whether the run was made with the app's model (its name and vocabulary size)."""
    config = manifest.get("config", {})
    return manifest.get("model", {}).get("name") == str(model.name) and config.get(
        "vocab_size"
    ) == getattr(model.config, "vocab_size", None)


def token_texts(frame: pd.DataFrame, tokenizer: Any | None) -> pd.Series:
    """Each row's token as the app labels tokens (byte tokens as <0xE4>, newlines as \\n): from
    ``tokenizer`` when the run shares the app's vocabulary, else the stored text made printable."""
    if tokenizer is not None:
        ids = frame["token_id"].unique()
        return frame["token_id"].map(dict(zip(ids, token_display_strings(tokenizer, ids))))
    texts = frame["token"].unique()
    return frame["token"].map({t: printable(t) for t in texts})


@dataclass(frozen=True)
class CorpusDir:
    """A corpus run's directory, keyed by its path and ``run_signature``, read from the files
    whenever a cached call is made."""

    path: Path

    @property
    def cache_key(self) -> tuple[str, str]:
        return str(self.path), run_signature(self.path)


@cached_analysis(keyed=("run", "model"), max_entries=2, show_spinner="Reading the corpus run …")
def read_run(run: CorpusDir, model: Any, shared: bool) -> CorpusRun:
    """The run in ``run.path``, its tokens labelled by ``model``'s tokenizer when ``shared``
    (the run was made with this model's vocabulary), else by their stored text."""
    path, tokenizer = str(run.path), model.tokenizer if shared else None
    frame = corpus.load(path)
    prompts = corpus.load_prompts(path).set_index("prompt_id")
    short = {pid: printable(text)[:PROMPT_WIDTH] for pid, text in prompts["text"].items()}
    table = frame.assign(
        kind=shown_kinds(frame),
        token=token_texts(frame, tokenizer),
        prompt=frame["prompt_id"].map(short),
    )
    table = quoted_tokens(table[[c for c in TABLE_COLUMNS if c in table]])
    texts = prompts["text"].to_dict()
    return CorpusRun(table, corpus.summary(path, frame), corpus.read_manifest(path), texts)


def keep_until_drawn(key: str, value: Any) -> None:
    """Set a widget's value so that it holds until its tab draws it. A value set for a widget that
    is not drawn now (another tab's picker) is dropped as stale after the next run while Streamlit
    links the key to that widget; deleting the key first removes the link."""
    st.session_state[key] = value
    del st.session_state[key]
    st.session_state[key] = value


def open_row(run: CorpusRun, row: pd.Series) -> str:
    """Put the row's prompt, its run settings and its position into the sidebar and every token
    picker (called from the table's selection callback); returns what the page says."""
    settings = run.manifest["settings"]
    seed, position = int(row["seed"]), int(row["position"])
    seeds = [seed] + [int(s) for s in settings["seeds"] if int(s) != seed]
    steps = min(int(settings["num_steps"]), MAX_STEPS)
    st.session_state.update(
        mode="Prompt",
        prompt=run.texts[row["prompt_id"]],
        steps=steps,
        seeds=", ".join(map(str, seeds[:MAX_SEEDS])),
        init_scale=float(settings["init_scale"]),
    )
    for key in SINGLE_PICKERS + MULTI_PICKERS:
        keep_until_drawn(key, [position] if key in MULTI_PICKERS else position)
    return (
        f"Opened prompt `{row['prompt_id']}` ({row['source']}) at position {position} "
        f"({row['token']}, {row['kind'].replace('_', ' ')}) in the other tabs: the sidebar holds "
        f"its text and the run's {steps} steps, seeds {', '.join(map(str, seeds[:MAX_SEEDS]))} "
        f"(seed {seed} first) and init scale {float(settings['init_scale']):g}; every token "
        f"picker shows position {position}."
    )


def _select_row() -> None:
    """The table's selection callback: open the chosen row in the other tabs."""
    rows = st.session_state["corpus_table"].selection.rows
    shown = st.session_state.get("corpus_shown")
    if rows and shown is not None:
        run, table = shown
        st.session_state["corpus_opened"] = open_row(run, table.iloc[rows[0]])


def in_words(value: object) -> str:
    """A filter choice as the page shows it: a kind such as fixed_point in words."""
    return str(value).replace("_", " ")


def filtered(table: pd.DataFrame) -> pd.DataFrame:
    """The rows that pass the source, kind and category filters (none chosen: all)."""
    columns = st.columns(3)
    choices = (
        ("source", "Source", sorted(table["source"].unique())),
        ("kind", "Kind", list(SHOWN_KINDS)),
        ("category", "Token category", sorted(table["category"].unique())),
    )
    keep = pd.Series(True, index=table.index)
    for col, (name, label, options) in zip(columns, choices):
        key = f"corpus_{name}"
        if key in st.session_state:  # picks from another directory that this one lacks
            st.session_state[key] = [p for p in st.session_state[key] if p in options]
        picked = col.multiselect(label, options, format_func=in_words, key=key, placeholder="all")
        if picked:
            keep &= table[name].isin(picked)
    return table[keep]


def figures_section(run: CorpusRun) -> None:
    """Kind shares by source and by category, orbit periods, steps to converge, λ_1 if run."""
    tables = run.tables
    left, right = st.columns(2)
    with left:
        chart(figures.kind_share_bars(tables["by_source"], by="source"), "corpus_by_source")
    with right:
        chart(figures.kind_share_bars(tables["by_category"], by="category"), "corpus_by_category")
    left, right = st.columns(2)
    with left:
        chart(figures.period_histogram_figure(tables["periods"]), "corpus_periods")
    with right:
        steps = figures.convergence_steps_figure(
            tables["steps_by_source"], tables["steps_by_difficulty"]
        )
        chart(steps, "corpus_steps")
    if tables.get("lambda_1") is not None:
        chart(figures.lambda_quantiles_figure(tables["lambda_1"]), "corpus_lambda")


def header(run: CorpusRun, path: Path, model: Any) -> None:
    """What the run is, and a warning when it was made with another model than the app's."""
    meta = run.tables["meta"]
    st.caption(
        f"`{path}`: model **{meta['model']}** at {meta['num_steps']} steps, {meta['rows']:,} token "
        f"trajectories ({meta['prompts']} prompts × seeds {', '.join(map(str, meta['seeds']))}); "
        f"a token's kind is the same for every seed at {meta['kind_agrees_across_seeds']:.1%} of "
        "positions. **converging**: a fixed point still moving when the run ended."
    )
    if not same_model(run.manifest, model):
        st.warning(
            f"This run was made with model {meta['model']}; the app has {model.name} loaded, so "
            "a row opened in the other tabs runs on that model."
        )


def column_formats(columns: Sequence[str] = ()) -> dict[str, Any]:
    """Headers in words and number formats of the token table: small steps in scientific
    notation."""
    number = st.column_config.NumberColumn
    config: dict[str, Any] = {c: st.column_config.Column(figures.words(c)) for c in columns}
    return config | {
        "final_step_size": number(figures.words("final_step_size"), format="%.2e"),
        "period": number("period (steps)", format="%.1f"),
        "steps_to_converge": number("steps to converge", format="%d"),
        "lambda_1": number("λ_1", format="%.3f"),
    }


def render(ctx: Context) -> None:
    """Open a corpus result directory: figures, a filterable token table, rows open in the tabs."""
    text = st.text_input("Corpus result directory", default_dir(), key="corpus_dir")
    path = resolve_dir(text)
    if not is_corpus_dir(path):
        st.info(
            f"`{path}` holds no corpus run (no corpus manifest.json): make one with "
            f"`python -m workbench.corpus run --out {text.strip() or DEFAULT_DIR}`."
        )
        return
    model = ctx.model
    try:
        manifest = corpus.read_manifest(path)
        run = read_run(CorpusDir(path), model, same_model(manifest, model))
    except (corpus.CorpusError, OSError) as exc:  # a run still starting, or a part unreadable
        st.info(str(exc))
        return
    header(run, path, model)
    if "corpus_opened" in st.session_state:
        st.success(st.session_state["corpus_opened"])
    figures_section(run)
    rows = filtered(run.table)
    shown = rows.head(MAX_ROWS).reset_index(drop=True)
    st.session_state["corpus_shown"] = (run, shown)
    note = f"; showing the first {MAX_ROWS:,}: narrow the filters" if len(rows) > MAX_ROWS else ""
    st.caption(f"{len(rows):,} of {len(run.table):,} rows{note}. Choose a row to open it.")
    st.dataframe(
        shown.assign(kind=shown["kind"].map(in_words)), key="corpus_table", on_select=_select_row, selection_mode="single-row",
        hide_index=True, column_config=column_formats(shown.columns),
    )  # fmt: skip
    table_download(rows, "corpus_tokens")
