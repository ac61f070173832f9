"""Configuration and result types of the data pipeline."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STARTER = "starter"
STARTER_SIZES = ("tiny", "small", "medium", "full")
INVALID_UTF8_POLICIES = ("replace", "skip")


class DataError(ValueError):
    """A corpus, source or prepared-data directory that cannot be used."""


@dataclass
class DataConfig:
    """What to read, how to tokenize it and how to pack it into rows of ``block_size + 1`` tokens.

    ``sources``: "starter" (the embedded corpus), paths (directories of text/code files, ``.jsonl`` or
    ``.parquet`` with a ``text`` column) or ``hf:PATH`` (a Hugging Face ``datasets`` directory written
    by ``save_to_disk``, or local json/jsonl/parquet/csv files read by ``load_dataset``; ``@split``
    picks a split). ``weights`` maps a source to its mixture weight (default 1): each of its documents
    is emitted ``floor(w)`` times plus once more with probability ``w - floor(w)``, seeded, so 0.5 keeps
    about half and 2 repeats every document. ``keep_all_sources`` names sources (or ``"source:kind"``, e.g.
    ``"starter:stdlib"``) whose documents continue into the next rows instead of losing their tail.
    ``invalid_utf8``: "replace" (U+FFFD per bad byte) or "skip" (drop the document); both are counted.
    """

    sources: list[str] = field(default_factory=lambda: [STARTER])
    keep_all_sources: list[str] = field(default_factory=list)
    vocab_size: int = 4096
    block_size: int = 256
    val_fraction: float = 0.05
    seed: int = 0
    starter_size: str = "small"
    tokenizer_path: str | None = None
    invalid_utf8: str = "replace"
    weights: dict[str, float] = field(default_factory=dict)

    def weight(self, source: str) -> float:
        """The mixture weight of ``source`` (1 when not named in ``weights``)."""
        return float(self.weights.get(source, 1.0))

    def validate(self) -> None:
        if not self.sources:
            raise DataError("DataConfig.sources is empty: name at least one source")
        if self.vocab_size < 256 + 32 + 1:
            raise DataError(
                f"vocab_size {self.vocab_size} is too small: byte-level BPE needs 256 byte tokens "
                "plus the 32 special tokens"
            )
        if self.vocab_size > 2**32:
            raise DataError(f"vocab_size {self.vocab_size} does not fit in uint32 shards")
        if self.block_size < 1:
            raise DataError(f"block_size must be positive, got {self.block_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise DataError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.starter_size not in STARTER_SIZES:
            raise DataError(
                f"starter_size must be one of {', '.join(STARTER_SIZES)}, got {self.starter_size!r}"
            )
        if self.invalid_utf8 not in INVALID_UTF8_POLICIES:
            raise DataError(
                f"invalid_utf8 must be one of {', '.join(INVALID_UTF8_POLICIES)}, "
                f"got {self.invalid_utf8!r}"
            )
        unknown = [
            s
            for s in self.keep_all_sources
            if s not in self.sources and s.rsplit(":", 1)[0] not in self.sources
        ]
        if unknown:
            raise DataError(f"keep_all_sources names source(s) not in sources: {unknown}")
        self._validate_weights()

    def _validate_weights(self) -> None:
        if not isinstance(self.weights, dict):
            raise DataError(f"weights must map a source to a number, got {self.weights!r}")
        unknown = sorted(set(self.weights) - set(self.sources))
        if unknown:
            raise DataError(f"weights names source(s) not in sources: {unknown}")
        for source, weight in self.weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise DataError(f"weights[{source!r}] = {weight!r} is not a number")
            if not math.isfinite(weight) or weight < 0:
                raise DataError(f"weights[{source!r}] = {weight} must be finite and >= 0")
        if all(self.weight(s) == 0 for s in self.sources):
            raise DataError("every source has weight 0: nothing would be prepared")


@dataclass
class PreparedData:
    """A built dataset: tokenizer, packed train/val shards and what went into them.

    ``shards`` maps a split to ``[[file name relative to directory, rows, bytes, sha256], ...]``.
    """

    directory: Path
    tokenizer_path: Path
    corpus_hash: str
    train_rows: int
    val_rows: int
    block_size: int
    vocab_size: int
    stats: dict[str, Any]
    shards: dict[str, list[list[Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["tokenizer_path"] = str(self.tokenizer_path.relative_to(self.directory))
        return data

    @classmethod
    def from_json(cls, directory: Path, data: dict[str, Any]) -> PreparedData:
        data = dict(data)
        data["directory"] = Path(directory)
        data["tokenizer_path"] = Path(directory) / data["tokenizer_path"]
        return cls(**data)

    def shard_paths(self, split: str) -> list[tuple[Path, int]]:
        if split not in self.shards:
            raise DataError(f"no split {split!r} in {self.directory} (have {sorted(self.shards)})")
        return [(self.directory / entry[0], int(entry[1])) for entry in self.shards[split]]

    def summary(self) -> str:
        return json.dumps(
            {
                "train_rows": self.train_rows,
                "val_rows": self.val_rows,
                "block_size": self.block_size,
                "vocab_size": self.vocab_size,
                "corpus_hash": self.corpus_hash[:16],
            }
        )
