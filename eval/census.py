"""Dynamics census: the kind of every token of held-out snippets at 4r̄, with several seeds, run
through the corpus engine (``workbench.corpus``; one implementation, docs/corpus.md).

Snippets (``--per-source`` of each, cut to ``--max-tokens``): numpy source code the model never saw,
GSM8k-style word problems in the training frame (prose) and as bare sentences (plain_prose),
held-out arithmetic and held-out depth tasks (``workbench.corpus.heldout``). Every token is
classified with ``workbench.classify_dynamics`` on its trajectory at 4r̄ iterations from each s_0
seed. Writes the engine's result directory to OUT/census-run (resumable: a relaunch redoes only
unfinished units) and its summary as OUT/census.md and OUT/census.json.

    python eval/census.py --checkpoint checkpoints/default --out eval/results
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import recurrent_model as rm
from workbench import corpus
from workbench.corpus.analyses import Settings
from workbench.corpus.engine import Job


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument("--out", default="eval/results")
    parser.add_argument("--per-source", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="default 4r̄")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model = rm.load_model(args.checkpoint)
    num_steps = args.steps or 4 * model.config.mean_recurrence
    settings = Settings(num_steps, tuple(range(args.seeds)), ("dynamics",))
    job = Job("heldout", settings, per_source=args.per_source, max_tokens=args.max_tokens)
    out = Path(args.out)
    run_dir = corpus.run(model, job, out / "census-run")
    shutil.copyfile(run_dir / "summary.md", out / "census.md")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(checkpoint=args.checkpoint, wall_s=round(time.perf_counter() - started, 1))
    (out / "census.json").write_text(json.dumps(summary, indent=2) + "\n")
    print((out / "census.md").read_text())
    return summary


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
