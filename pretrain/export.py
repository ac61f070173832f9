"""Export a training run's checkpoint as a shippable model directory with its provenance.

    python pretrain/export.py --run runs/default --out checkpoints/default

Copies the model files of the run's latest (or a named) checkpoint — config.json, model.safetensors,
tokenizer.json, no optimizer state — after loading them with ``recurrent_model.load_model`` (a
checkpoint the trainer did not export, see ``train.export_every``, is consolidated from its shards
first), and writes
``provenance.json``: the commands that produced the run, its config, corpus hash, git commit, steps,
tokens seen, training time and the final training and validation losses from metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pretrain.checkpointing import LATEST, STATE_JSON, consolidate_checkpoint, is_exported
from recurrent_model import atomic_directory, load_model
from recurrent_model.checkpoint import write_checkpoint_files


def read_metrics(path: Path, up_to_step: int) -> list[dict[str, Any]]:
    """metrics.jsonl records of steps ≤ up_to_step, one per step (after a resume, the last wins)."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("step", 0) <= up_to_step:
                by_step[record["step"]] = record
    return [by_step[k] for k in sorted(by_step)]


def last_value(records: Sequence[dict[str, Any]], key: str) -> Any:
    for record in reversed(records):
        if key in record:
            return record[key]
    return None


def git_commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def provenance(run: Path, checkpoint: Path, notes: Sequence[str]) -> dict[str, Any]:
    """Everything needed to reproduce and judge the exported checkpoint."""
    # run.json, then one run-resume-N.json per resume: in the order they ran, so the last is the config
    # the final steps trained with (a resume may change the schedule)
    infos = sorted(
        (json.loads(p.read_text()) for p in run.glob("run*.json")),
        key=lambda info: info.get("started_at_step", 0),
    )
    state = json.loads((checkpoint / STATE_JSON).read_text())
    step = int(state["step"])
    records = read_metrics(run / "metrics.jsonl", step)
    val = {k: v for k, v in (records[-1] if records else {}).items() if k.startswith("val_loss_")}
    if not val:
        val = {
            k: last_value(records, k)
            for k in sorted({k for r in records for k in r if k.startswith("val_loss_")})
        }
    # Logged every log_every steps: each record's step time stands for the steps since the last one.
    timed = [r for r in records if "step_time_s" in r]
    train_time = sum(
        r["step_time_s"] * (r["step"] - (prev["step"] if prev else 0))
        for prev, r in zip([None, *timed[:-1]], timed, strict=True)
    )
    latest_info = infos[-1] if infos else {}
    return {
        "commands": [info["command"] for info in infos],
        "notes": list(notes),
        "config": latest_info.get("config") or state.get("config"),
        "model": latest_info.get("model"),
        "parameters": latest_info.get("parameters"),
        "corpus_hash": latest_info.get("corpus_hash") or state.get("corpus_hash"),
        "train_rows": latest_info.get("train_rows"),
        "git_commit": git_commit(Path(__file__).resolve().parents[1]),
        "run_commits": [info.get("git_commit") for info in infos if info.get("git_commit")],
        "torch": latest_info.get("torch"),
        "steps": step,
        "tokens_seen": state.get("tokens"),
        "skipped_steps": state.get("skipped"),
        "training_time_s": train_time,
        "final_train_loss": last_value(records, "loss"),
        "final_val_losses": val,
        "source_checkpoint": str(checkpoint),
    }


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the run directory (holds checkpoints/)")
    parser.add_argument("--out", required=True, help="where the model directory goes")
    parser.add_argument(
        "--checkpoint", help="a checkpoint name under checkpoints/ (default: latest)"
    )
    parser.add_argument("--note", action="append", default=[], help="a line for provenance notes")
    args = parser.parse_args(argv)
    run = Path(args.run)
    root = run / "checkpoints"
    name = args.checkpoint or (root / LATEST).read_text().strip()
    checkpoint = root / Path(name).name
    record = provenance(run, checkpoint, args.note)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=root) as scratch:
        weights = checkpoint
        if not is_exported(checkpoint):  # consolidate the shards of a checkpoint between exports
            weights = Path(scratch) / "model"
            consolidate_checkpoint(checkpoint, weights)
        model = load_model(weights)  # proves the files load before anything is written
    with atomic_directory(args.out) as tmp:
        write_checkpoint_files(model, tmp)
        (tmp / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"exported {checkpoint} (step {record['steps']}) to {args.out}")
    return Path(args.out)


if __name__ == "__main__":
    main()
