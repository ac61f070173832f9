"""The result directory of a corpus run: its manifest (identity and timings), prompts and parts.

    DIR/manifest.json          identity (model, weights hash, config, settings, data) + per-unit timings
    DIR/prompts.parquet        one row per prompt: id, source, text, difficulty, group, tokens, unit
    DIR/tokens/part-NNNNN.parquet   one unit's rows, written atomically, its unit key in the metadata
    DIR/summary.md             the summaries (``workbench.corpus.summary``)

A part appears whole or not at all (written to a hidden sibling, fsynced, renamed), so a killed run
leaves only complete parts; a relaunch verifies each finished part (readable, the unit key and row
count it should hold) and redoes the others. A part that fails verification is moved to
``DIR/rejected/`` for inspection, never deleted.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recurrent_model.atomic_io import atomic_write_bytes, atomic_write_text

from .sources import CorpusError
from .units import Unit

MANIFEST = "manifest.json"
IDENTITY_KEYS = ("model", "config", "settings", "data")


def part_path(out: Path, unit: Unit) -> Path:
    return out / "tokens" / f"part-{unit.index:05d}.parquet"


def write_part(out: Path, unit: Unit, frame: pd.DataFrame, meta: dict[str, Any]) -> None:
    """Write one unit's rows atomically, with its key, row count and ``meta`` in the metadata."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    info = {"unit": unit.index, "key": unit.key, "rows": len(frame), **meta}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), b"corpus": json.dumps(info).encode()}
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(part_path(out, unit), buffer.getvalue())


def part_info(path: Path) -> dict[str, Any] | None:
    """The metadata a finished part carries, or None when it cannot be read as one."""
    try:
        meta = pq.read_schema(path).metadata or {}
        info = json.loads(meta[b"corpus"])
        rows = pq.read_metadata(path).num_rows
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
    return info if info.get("rows") == rows else None


def finished_units(out: Path, units: list[Unit], rows_per_token: int) -> tuple[set[int], list[str]]:
    """Indices of the units whose part verifies, and one line per part moved to ``rejected/``."""
    done: set[int] = set()
    notes: list[str] = []
    for unit in units:
        path = part_path(out, unit)
        if not path.exists():
            continue
        info = part_info(path)
        expected = unit.tokens * rows_per_token
        if info is not None and info.get("key") == unit.key and info["rows"] == expected:
            done.add(unit.index)
            continue
        rejected = out / "rejected"
        rejected.mkdir(exist_ok=True)
        shutil.move(str(path), rejected / path.name)
        why = (
            "unreadable"
            if info is None
            else f"unit key or rows differ ({info.get('rows')} ≠ {expected})"
        )
        notes.append(f"part {path.name} failed verification ({why}): moved to rejected/, redone")
    return done, notes


def check_identity(out: Path, identity: dict[str, Any]) -> None:
    """Refuse (one line) a directory that holds another run, or unknown files; else write the
    manifest when it is new."""
    manifest = out / MANIFEST
    identity = json.loads(json.dumps(identity, default=str))  # as it reads back from the file
    if manifest.exists():
        try:
            held = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            raise CorpusError(f"{manifest} is unreadable ({exc}): use another --out") from None
        diff = identity_diff(held, identity)
        if diff:
            raise CorpusError(
                f"{out} holds a corpus run with other settings ({'; '.join(diff)}): use another --out"
            )
        return
    if out.exists() and any(out.iterdir()):
        raise CorpusError(f"{out} is not empty and holds no corpus manifest: use another --out")
    write_manifest(out, {**identity, "units": {}})


def identity_diff(held: dict[str, Any], identity: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: held → new`` for each identity field that differs (nested dicts flattened)."""
    out: list[str] = []
    for key in IDENTITY_KEYS if not prefix else sorted(set(held) | set(identity)):
        a, b = held.get(key), identity.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += identity_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {_short(a)} → {_short(b)}")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "…"


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n")


def read_manifest(out: Path) -> dict[str, Any]:
    path = Path(out) / MANIFEST
    if not path.exists():
        raise CorpusError(f"{out} holds no corpus run (no {MANIFEST})")
    return json.loads(path.read_text())


def record_timings(out: Path, units: list[Unit]) -> dict[str, Any]:
    """Copy every finished part's timing into the manifest's ``units`` (rank 0, at the end)."""
    manifest = read_manifest(out)
    for unit in units:
        info = part_info(part_path(out, unit))
        if info is not None:
            manifest["units"][str(unit.index)] = {
                k: info[k] for k in ("seconds", "rank", "rows", "tokens", "device") if k in info
            }
    write_manifest(out, manifest)
    return manifest


def load(out: str | Path) -> pd.DataFrame:
    """Every token row of a corpus run (the Parquet dataset ``DIR/tokens``)."""
    out = Path(out)
    read_manifest(out)
    tokens = out / "tokens"
    if not tokens.exists() or not any(tokens.glob("part-*.parquet")):
        raise CorpusError(f"{out} has no finished units yet")
    return pd.read_parquet(tokens)


def load_prompts(out: str | Path) -> pd.DataFrame:
    """The prompts of a corpus run: id, source, text, difficulty, group, tokens, unit."""
    return pd.read_parquet(Path(out) / "prompts.parquet")


def write_prompts(out: Path, units: list[Unit]) -> None:
    rows = [
        {
            "prompt_id": t.prompt.id,
            "source": t.prompt.source,
            "text": t.prompt.text,
            "difficulty": t.prompt.difficulty,
            "group": t.prompt.group,
            "tokens": len(t.ids),
            "unit": unit.index,
        }
        for unit in units
        for t in unit.prompts
    ]
    buffer = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buffer, index=False)
    atomic_write_bytes(out / "prompts.parquet", buffer.getvalue())
