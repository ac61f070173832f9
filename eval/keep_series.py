"""Keep a training run's intermediate checkpoints with the exported model, in bfloat16, for
``workbench.checkpoint_series`` and ``notebooks/training_dynamics.ipynb``.

    python eval/keep_series.py --run runs/default --out checkpoints/default/series --steps 40 80 120

Each ``step-N`` is loaded with ``recurrent_model.load_model``, cast to bfloat16 (half the bytes; the
workbench loads it back as float32) and saved with its tokenizer. The run's logged training and
validation losses (``metrics.jsonl``, step / loss / val_loss_* only) and a ``provenance.json`` naming the
run, the steps and the cast go alongside.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

import recurrent_model as rm

KEPT_FIELDS = ("step", "loss", "lr", "depth_no_grad", "depth_grad", "tokens")


def keep_series(run: Path, out: Path, steps: Sequence[int]) -> list[Path]:
    """Write bfloat16 copies of ``run``'s checkpoints at ``steps`` under ``out``; returns their paths."""
    written = []
    for step in steps:
        source = run / "checkpoints" / f"step-{step:07d}"
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} is not a checkpoint of {run}")
        model = rm.load_model(source).to(torch.bfloat16)
        model.save_pretrained(out / source.name)
        written.append(out / source.name)
    records = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            if "loss" in record and record.get("step", 0) <= max(steps):
                records.append(
                    {
                        k: v
                        for k, v in record.items()
                        if k in KEPT_FIELDS or k.startswith("val_loss_")
                    }
                )
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    provenance = {
        "run": str(run),
        "steps": list(steps),
        "dtype": "bfloat16 copies of the run's float32 checkpoints (eval/keep_series.py)",
        "metrics": "metrics.jsonl: the run's logged step, loss, lr, depth and val_loss_* fields",
    }
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return written


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", required=True, type=int, nargs="+")
    args = parser.parse_args(argv)
    paths = keep_series(args.run, args.out, sorted(args.steps))
    for path in paths:
        size = sum(p.stat().st_size for p in path.iterdir())
        print(f"{path}: {size / 1e6:.1f} MB")
    return paths


if __name__ == "__main__":
    main()
