"""Helpers shared by the test modules (fixtures shared by them live in conftest.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = (
    "the model iterates its core block on a latent state while every token reads the "
    "prelude output and the coda decodes numbers 12 345 and 6789 plus def return if else "
    "sum product answer question step first then finally"
).split()


def write_corpus(directory: Path, docs: int = 160) -> None:
    """``docs`` text files of 50 to 90 words from ``WORDS`` (the same for every call)."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 90)))
        (directory / f"doc{i:03d}.txt").write_text(text + "\n", encoding="utf-8")


def write_config(path: Path, corpus: Path, cache: Path, **train: object) -> Path:
    """A training config of a 32-wide tiny model on ``corpus`` (CPU, fp32, one thread); ``train``
    overrides keys of its train section."""
    settings = dict(
        max_steps=8,
        micro_batch_size=2,
        lr=3.0e-3,
        warmup_steps=2,
        cooldown_steps=2,
        checkpoint_every=4,
        keep_last=2,
        log_every=1,
        health_every=4,
        val_every=4,
        val_batches=2,
        progress=False,
        threads=1,
        device="cpu",
        precision="fp32",
    )
    settings.update(train)
    config = {
        "model": {
            "preset": "tiny",
            "overrides": {
                "n_embd": 32,
                "n_heads": 2,
                "intermediate_size": 64,
                "mean_recurrence": 4,
                "mean_backprop_depth": 2,
            },
        },
        "data": {
            "sources": [str(corpus)],
            "vocab_size": 320,
            "block_size": 32,
            "val_fraction": 0.1,
            "cache_dir": str(cache),
        },
        "train": settings,
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path
