"""Accuracy on held-out depth tasks (``tasks.depth``) vs recurrence depth, per kind and level.

Each prompt is ``shots`` solved train-split tasks of the same kind (at the same level, or at the top
trained level for levels above it, which have no train split), then a held-out task's prompt; fewer
shots where that would not fit the model's context. The model
answers greedily (s_0 = 0, KV-cached ``generate``); the answer is the first line of what it writes,
compared exactly with the task's answer. Harder levels should need more iterations before accuracy
saturates; levels above the trained ones test whether accuracy keeps rising past r̄.

    python eval/depth_tasks.py --checkpoint checkpoints/default
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from depth_grid import depth_grid  # eval/ (the script's own directory)
from tqdm import tqdm

import recurrent_model as rm
from tasks import depth

DEFAULT_LEVELS = {
    "variables": (1, 2, 4, 6, 8, 10),
    "carries": (1, 2, 4, 6, 8),
    "list_ops": (1, 2, 3, 5, 7),
    "reachability": (1, 3, 5, 7),
}


def few_shot_prompt(task: depth.Task, shots: int, seed: int) -> str:
    """``shots`` solved train-split tasks of the same kind, a blank line after each, then the task."""
    level = min(task.level, depth.TRAIN_LEVELS[task.kind])
    examples = depth.make_tasks(task.kind, shots, level, seed, split="train")
    return "\n\n".join([*(t.render() for t in examples), task.prompt])


def first_line(text: str) -> str:
    return text.strip().split("\n")[0].strip()


@torch.no_grad()
def depth_task_accuracy(
    model: rm.RecurrentLM,
    depths: Sequence[int],
    levels: Mapping[str, Sequence[int]] = DEFAULT_LEVELS,
    n: int = 30,
    shots: int = 2,
    seed: int = 2024,
) -> pd.DataFrame:
    """Greedy exact-match accuracy per (kind, level, steps) on ``n`` held-out tasks each."""
    tok = model.tokenizer
    if tok is None:
        raise ValueError("the checkpoint has no tokenizer.json, so tasks cannot be encoded")
    cells = [(kind, level) for kind, lv in levels.items() for level in lv]
    rows = []
    for kind, level in tqdm(cells, desc="depth tasks", unit="level"):
        tasks = depth.make_tasks(kind, n, level, seed, split="heldout")
        new_tokens = max(len(tok.encode(t.answer, add_bos=False)) for t in tasks) + 2
        room = model.config.block_size - new_tokens
        encoded = []
        for k, task in enumerate(tasks):  # fewer shots where the prompt would not fit the context
            for used in range(shots, -1, -1):
                ids = tok.encode(few_shot_prompt(task, used, seed + k))
                if len(ids) <= room:
                    break
            encoded.append(ids[-room:])
        width = max(map(len, encoded))
        ids = torch.full((len(encoded), width), tok.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(encoded):
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        for d in depths:
            out = model.generate(
                ids, new_tokens, num_steps=d, attention_mask=mask, init_scale=0.0,
                stop_tokens=[tok.eos_id, tok.bos_id],
            )  # fmt: skip
            texts = [tok.decode(r[width:].tolist(), skip_special_tokens=True) for r in out]
            correct = [first_line(x) == t.answer for x, t in zip(texts, tasks, strict=True)]
            rows.append(
                {
                    "kind": kind,
                    "level": level,
                    "trained_level": level <= depth.TRAIN_LEVELS[kind],
                    "steps": d,
                    "accuracy": float(np.mean(correct)),
                    "n": n,
                }
            )
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = rm.load_model(args.checkpoint)
    frame = depth_task_accuracy(model, depth_grid(model.config.mean_recurrence), n=args.n)
    table = frame.pivot_table(index=["kind", "level"], columns="steps", values="accuracy")
    print(table.to_string(float_format=lambda v: f"{v:.2f}"))
    return frame


if __name__ == "__main__":
    main()
