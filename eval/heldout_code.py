"""Next-token loss vs recurrence depth on source code the model never saw: numpy's own modules.

The starter corpus trains on the Python standard library only, so numpy's package source (installed in
the environment) is code in the same language from a different project. Files are chosen by a seeded
hash of their path (tests excluded), each encoded with a leading BOS as the packer does, cut into rows of
``block_size`` + 1 tokens; the same rows and the same s_0 seed are scored at every depth.

    python eval/heldout_code.py --checkpoint checkpoints/default --depths 1 4 16 64
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from depth_grid import depth_grid  # eval/ (the script's own directory)

import recurrent_model as rm
from workbench.corpus.heldout import numpy_sources


def code_rows(
    tokenizer: rm.HuginnTokenizer,
    sources: Sequence[tuple[str, str]],
    block_size: int,
    max_rows: int,
) -> torch.Tensor:
    """(rows, block_size + 1) token ids: each file as "# <path>\\n<text>" with BOS, cut into rows."""
    rows: list[list[int]] = []
    for rel, text in sources:
        ids = tokenizer.encode(f"# {rel}\n{text}")
        for start in range(0, len(ids) - block_size, block_size + 1):
            rows.append(ids[start : start + block_size + 1])
            if len(rows) == max_rows:
                return torch.tensor(rows)
    if not rows:
        raise ValueError("the numpy sources gave no full row; lower block_size")
    return torch.tensor(rows)


@torch.no_grad()
def loss_by_depth(
    model: rm.RecurrentLM,
    rows: torch.Tensor,
    depths: Sequence[int],
    batch_size: int = 8,
    seed: int = 0,
) -> pd.DataFrame:
    """Mean next-token loss over ``rows`` at each depth (same batches and s_0 seeds at every depth)."""
    out = []
    for depth in depths:
        total, count = 0.0, 0
        for i in range(0, len(rows), batch_size):
            batch = rows[i : i + batch_size]
            g = torch.Generator().manual_seed(seed + i)
            result = model(batch[:, :-1], num_steps=depth, labels=batch[:, 1:], generator=g)
            total += float(result.loss) * batch.numel()
            count += batch.numel()
        out.append({"steps": depth, "loss": total / count})
    frame = pd.DataFrame(out)
    frame["gain_vs_r1"] = 1 - frame["loss"] / frame["loss"].iloc[0] if depths[0] == 1 else np.nan
    return frame


def heldout_code_losses(
    model: rm.RecurrentLM,
    depths: Sequence[int],
    max_rows: int = 48,
    block_size: int = 256,
    max_files: int = 40,
) -> pd.DataFrame:
    """Loss vs depth on ``max_rows`` rows of numpy source (see the module docstring)."""
    if model.tokenizer is None:
        raise ValueError("the checkpoint has no tokenizer.json, so code cannot be encoded")
    rows = code_rows(model.tokenizer, numpy_sources(max_files), block_size, max_rows)
    return loss_by_depth(model, rows, depths)


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument(
        "--depths", type=int, nargs="+", default=None, help="default: depth_grid(r̄)"
    )
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = rm.load_model(args.checkpoint)
    depths = args.depths or depth_grid(model.config.mean_recurrence)
    frame = heldout_code_losses(model, depths, max_rows=args.rows)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if args.json:
        Path(args.json).write_text(json.dumps(frame.to_dict("records"), indent=2) + "\n")
    return frame


if __name__ == "__main__":
    main()
