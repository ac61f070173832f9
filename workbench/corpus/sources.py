"""Prompts for the corpus engine: a text file, JSONL/CSV/Parquet with a column, a Hugging Face
``datasets`` name (local cache when offline), or the project's held-out sets by name.

Every prompt gets a stable id, a hash of its source and text, so results join back to their text
whatever order or machine produced them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .heldout import HELDOUT


class CorpusError(ValueError):
    """Bad input or settings for the corpus engine; the message is one line naming the problem."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: where it came from, its text, and (for task sets) a difficulty and group."""

    source: str
    text: str
    difficulty: float = math.nan
    group: str = ""

    @property
    def id(self) -> str:
        return prompt_id(self.source, self.text)


def prompt_id(source: str, text: str) -> str:
    """16 hex digits of sha256(source NUL text)."""
    return hashlib.sha256(f"{source}\0{text}".encode()).hexdigest()[:16]


TABLE_SUFFIXES = {".jsonl", ".json", ".csv", ".parquet"}


def read_prompts(
    data: str | None, column: str | None = None, split: str = "train", per_source: int = 50
) -> list[Prompt]:
    """The prompts ``data`` names: a path, held-out set names ("heldout" or "code,prose,…"), or a
    ``datasets`` name. Empty prompts are dropped; no prompt at all is an error."""
    data = data or "heldout"
    path = Path(data)
    if path.exists():
        prompts = _from_file(path, column)
    elif _heldout_names(data) is not None:
        prompts = [
            Prompt(name, text, difficulty, group or name)
            for name in _heldout_names(data) or ()
            for text, difficulty, group in HELDOUT[name](per_source)
        ]
    else:
        prompts = _from_datasets(data, column, split)
    prompts = [p for p in prompts if p.text.strip()]
    if not prompts:
        raise CorpusError(f"{data}: no prompts (the file or column is empty)")
    return prompts


def _heldout_names(data: str) -> list[str] | None:
    names = list(HELDOUT) if data == "heldout" else [n.strip() for n in data.split(",")]
    return names if all(n in HELDOUT for n in names) else None


def _from_file(path: Path, column: str | None) -> list[Prompt]:
    if path.is_dir() or path.suffix not in TABLE_SUFFIXES:
        if path.is_dir():
            raise CorpusError(f"{path} is a directory: give a text, JSONL, CSV or Parquet file")
        lines = path.read_text(encoding="utf-8").splitlines()
        return [Prompt(path.stem, line) for line in lines]
    frame = _read_table(path)
    return _column_prompts(frame, column, path.stem, str(path))


def _read_table(path: Path) -> pd.DataFrame:
    try:
        if path.suffix in (".jsonl", ".json"):
            rows = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln]
            return pd.DataFrame(rows)
        if path.suffix == ".csv":
            return pd.read_csv(path, keep_default_na=False)
        return pd.read_parquet(path)
    except (ValueError, OSError) as exc:
        raise CorpusError(f"{path}: cannot read it as {path.suffix[1:]}: {exc}") from None


def _column_prompts(
    frame: pd.DataFrame, column: str | None, source: str, what: str
) -> list[Prompt]:
    if len(frame) == 0:
        raise CorpusError(f"{what}: no rows")
    if column is None:
        raise CorpusError(
            f"{what}: name the text column with --column (one of {list(frame.columns)})"
        )
    if column not in frame.columns:
        raise CorpusError(f"{what}: no column {column!r} (columns: {list(frame.columns)})")
    return [Prompt(source, str(text)) for text in frame[column].tolist()]


def _from_datasets(name: str, column: str | None, split: str) -> list[Prompt]:
    try:
        import datasets
    except ImportError:
        raise CorpusError(
            f"{name}: not a file or a held-out set name ({', '.join(HELDOUT)}), and the "
            "`datasets` package is not installed to read it as a dataset"
        ) from None
    try:
        table = datasets.load_dataset(name, split=split)
    except Exception as exc:  # the library raises many kinds; each becomes one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CorpusError(
            f"{name}: not a file or a held-out set name ({', '.join(HELDOUT)}), and not a "
            f"dataset in the local cache (split {split!r}): {first}"
        ) from None
    return _column_prompts(table.to_pandas(), column, name.replace("/", "_"), f"{name}[{split}]")
