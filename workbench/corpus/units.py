"""Tokenised prompts, work units of about equal token count, and the batches inside a unit.

Units are defined by the data alone (never by the number of ranks), so a relaunch on any number
of ranks finds the same units and skips the finished ones. Prompts are sorted by length before
they are cut into units, so a unit's prompts have similar lengths and pad little.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..collect import aligned_length
from .sources import CorpusError, Prompt


@dataclass(frozen=True)
class Tokenized:
    prompt: Prompt
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Unit:
    """A group of prompts processed and written together (one Parquet part)."""

    index: int
    prompts: tuple[Tokenized, ...]

    @property
    def key(self) -> str:
        """A hash of the unit's prompt ids and lengths: a finished part must carry the same."""
        text = ",".join(f"{t.prompt.id}:{len(t.ids)}" for t in self.prompts)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def tokens(self) -> int:
        return sum(len(t.ids) for t in self.prompts)


def tokenize(
    prompts: Sequence[Prompt], tokenizer, block_size: int, max_tokens: int | None = None
) -> tuple[list[Tokenized], int]:
    """Token ids of every prompt (cut to ``max_tokens``), with duplicates (same id) dropped.

    Returns the prompts and the number of duplicates dropped. A prompt longer than the model's
    context is an error naming it (cut with ``max_tokens``).
    """
    seen: set[str] = set()
    out: list[Tokenized] = []
    for prompt in prompts:
        if prompt.id in seen:
            continue
        seen.add(prompt.id)
        ids = tuple(tokenizer.encode(prompt.text))
        ids = ids[:max_tokens] if max_tokens else ids
        if not ids:
            raise CorpusError(f"prompt {prompt.id} ({prompt.source}) has no tokens")
        if len(ids) > block_size:
            raise CorpusError(
                f"prompt {prompt.id} ({prompt.source}) has {len(ids)} tokens, more than the "
                f"model's context of {block_size}: cut prompts with --max-tokens {block_size}"
            )
        out.append(Tokenized(prompt, ids))
    return out, len(prompts) - len(out)


def make_units(prompts: Sequence[Tokenized], unit_tokens: int) -> list[Unit]:
    """Prompts sorted by (length, id), cut into consecutive units of about ``unit_tokens`` tokens."""
    if unit_tokens < 1:
        raise CorpusError(f"--unit-tokens must be >= 1, got {unit_tokens}")
    ordered = sorted(prompts, key=lambda t: (len(t.ids), t.prompt.id))
    units: list[Unit] = []
    current: list[Tokenized] = []
    for item in ordered:
        current.append(item)
        if sum(len(t.ids) for t in current) >= unit_tokens:
            units.append(Unit(len(units), tuple(current)))
            current = []
    if current:
        units.append(Unit(len(units), tuple(current)))
    return units


Run = tuple[Tokenized, int]  # (prompt, seed)


def batches(
    unit: Unit, seeds: Sequence[int], block_size: int, max_batch_tokens: int
) -> list[list[Run]]:
    """The unit's (prompt, seed) runs in batches: one aligned length per batch, at most
    ``max_batch_tokens`` padded positions each (one run at least), a prompt's seeds together."""
    by_width: dict[int, list[Run]] = {}
    for item in unit.prompts:
        width = aligned_length(len(item.ids), block_size)
        by_width.setdefault(width, []).extend((item, seed) for seed in seeds)
    out: list[list[Run]] = []
    for width, runs in sorted(by_width.items()):
        rows = max(1, max_batch_tokens // width)
        out.extend(runs[i : i + rows] for i in range(0, len(runs), rows))
    return out
