"""Evaluate a trained recurrent-depth checkpoint: does it use its recurrence?

Prints a table and writes results.json, results.md and a plot (HTML) to --out:
1. validation loss at r = 1, 2, 4, 8, r̄, 2r̄, 4r̄ (should fall from 1 to r̄ and stay flat beyond);
2. accuracy on freshly generated held-out arithmetic vs r, per difficulty (digits per operand);
3. path independence: final-state spread across 5 random s_0 at 4r̄ (and the phase-blind attractor
   distance), on a few prompts;
4. the share of tokens classified fixed point / orbit / slider / other on those prompts at 4r̄;
5. held-out accuracy of the linear probes (iteration counter; correct vs incorrect arithmetic);
6. loss vs r on held-out source code (numpy's modules, ``heldout_code.py``): the gain from r = 1 to r̄
   and the drift from r̄ to 4r̄;
7. accuracy on held-out depth tasks vs r per kind and level (``depth_tasks.py``), including levels
   harder than any trained one.

Usage: python eval/evaluate_checkpoint.py --checkpoint checkpoints/default --out eval/results
The validation rows are rebuilt deterministically from the data config in the checkpoint's
provenance.json (cached under --data-cache), using the checkpoint's own tokenizer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import recurrent_model as rm
import workbench as wb
from pretrain.config import DataSection
from pretrain.data import PackedLoader, prepare_data
from tasks.arithmetic import Problem, make_problems, parse_answer, render
from workbench.arithmetic import arithmetic_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from depth_grid import depth_grid  # noqa: E402
from depth_tasks import DEFAULT_LEVELS, depth_task_accuracy  # noqa: E402
from heldout_code import heldout_code_losses  # noqa: E402

PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Question: Claire makes a 3 egg omelet every morning. How many eggs does she eat in 4 weeks?\nAnswer:",
    "37 + 48 = 85\n12 * 7 = 84\n245 + 381 =",
)


@torch.no_grad()
def validation_losses(
    model: rm.RecurrentLM,
    loader: PackedLoader,
    depths: Sequence[int],
    max_batches: int,
    seed: int = 0,
) -> pd.DataFrame:
    """Mean next-token loss over up to ``max_batches`` validation batches, per depth (same s_0 seed)."""
    totals = {d: 0.0 for d in depths}
    count = 0
    for i, (inputs, labels) in enumerate(loader):
        if i >= max_batches:
            break
        for d in depths:
            g = torch.Generator().manual_seed(seed + i)
            out = model(inputs, num_steps=d, labels=labels, generator=g)
            totals[d] += float(out.loss) * inputs.shape[0]
        count += inputs.shape[0]
    if count == 0:
        raise ValueError("the validation split is empty")
    return pd.DataFrame({"steps": list(depths), "val_loss": [totals[d] / count for d in depths]})


def few_shot_prompt(difficulty: int, prompt: str, shots: int, seed: int) -> str:
    """``shots`` solved training-split problems of the same difficulty, one per line, then ``prompt``."""
    examples = make_problems(shots, difficulty, seed, split="train")
    return "\n".join([*(render(p, a) for p, a in examples), prompt])


@torch.no_grad()
def arithmetic_accuracy(
    model: rm.RecurrentLM,
    depths: Sequence[int],
    difficulties: Sequence[int],
    n: int,
    shots: int = 3,
    seed: int = 1234,
) -> pd.DataFrame:
    """Greedy accuracy on held-out problems per (difficulty, steps), prompts batched left-padded."""
    tok = model.tokenizer
    if tok is None:
        raise ValueError("the checkpoint has no tokenizer.json, so arithmetic cannot be scored")
    rows = []
    for difficulty in difficulties:
        problems = make_problems(n, difficulty, seed)
        encoded = [
            tok.encode(few_shot_prompt(difficulty, p, shots, seed + k))
            for k, (p, _) in enumerate(problems)
        ]
        width = max(map(len, encoded))
        ids = torch.full((len(encoded), width), tok.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(encoded):
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        new_tokens = 2 * difficulty + 4
        for d in depths:
            out = model.generate(
                ids, new_tokens, num_steps=d, attention_mask=mask, init_scale=0.0,
                stop_tokens=[tok.eos_id, tok.bos_id],
            )  # fmt: skip
            texts = [tok.decode(row[width:].tolist(), skip_special_tokens=True) for row in out]
            answers = [parse_answer(t.split("\n")[0]) for t in texts]
            correct = [
                a is not None and a == int(ans)
                for a, (_, ans) in zip(answers, problems, strict=True)
            ]
            rows.append(
                {"difficulty": difficulty, "steps": d, "accuracy": float(np.mean(correct)), "n": n}
            )
    return pd.DataFrame(rows)


def trajectory_statistics(
    model: rm.RecurrentLM, prompts: Sequence[str], num_steps: int, seeds: Sequence[int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per prompt: final spread and attractor distance over seeds; dynamics kinds of every token."""
    spread_rows, kinds = [], []
    for prompt in prompts:
        ids = model.tokenizer.encode(prompt)
        traj = wb.collect(model, ids, num_steps, seeds=seeds, progress=False)
        states = traj.states
        final = wb.path_independence(states)
        final = final[final["step"] == num_steps]
        attractor = wb.attractor_distance(states)
        spread_rows.append(
            {
                "prompt": prompt.splitlines()[0][:40],
                "tokens": len(ids),
                "final_spread": float(final["spread"].mean()),
                "max_final_spread": float(final["spread"].max()),
                "attractor_distance": float(attractor["attractor_distance"].mean()),
            }
        )
        dyn = wb.classify_dynamics(states[0])
        kinds.append(dyn["kind"])
    shares = pd.concat(kinds).value_counts(normalize=True).rename("share").reset_index()
    return pd.DataFrame(spread_rows), shares


def probe_accuracies(
    model: rm.RecurrentLM, r_mean: int, n: int, difficulty: int = 2
) -> pd.DataFrame:
    """Held-out accuracy of the workbench's linear probes on this checkpoint.

    Iteration counter: the step index from ln_f(s_i) on the arithmetic prompt at 4r̄. Correctness:
    correct vs incorrect answers to few-shot held-out problems, from their trajectories at r̄.
    """
    ids = model.tokenizer.encode(PROMPTS[-1])
    counter = wb.iteration_probe(wb.collect(model, ids, 4 * r_mean, progress=False).states[0])
    problems = [
        Problem(few_shot_prompt(difficulty, p, 3, k), a)
        for k, (p, a) in enumerate(make_problems(n, difficulty, 4321))
    ]
    frame, features = arithmetic_dataset(model, problems, r_mean, max_new_tokens=difficulty + 2)
    rows = [
        {"probe": "iteration counter", "test_accuracy": counter.test_accuracy,
         "chance": counter.chance, "n_test": counter.n_test},
    ]  # fmt: skip
    if 0 < frame["correct"].sum() < len(frame) - 1:
        correct = wb.correctness_probe(features, frame["correct"].to_numpy())
        rows.append(
            {"probe": f"correct vs incorrect ({difficulty}-digit, r={r_mean})",
             "test_accuracy": correct.test_accuracy, "chance": correct.chance,
             "n_test": correct.n_test}
        )  # fmt: skip
    return pd.DataFrame(rows)


def plot(
    losses: pd.DataFrame,
    accuracy: pd.DataFrame,
    mean_recurrence: int,
    code: pd.DataFrame | None = None,
    tasks: pd.DataFrame | None = None,
) -> go.Figure:
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "loss vs r (validation, held-out code)",
            "held-out arithmetic accuracy vs r",
            "held-out depth tasks: accuracy vs r",
        ),
    )
    fig.add_trace(
        go.Scatter(x=losses["steps"], y=losses["val_loss"], mode="lines+markers", name="val loss"),
        1,
        1,
    )
    if code is not None:
        fig.add_trace(
            go.Scatter(x=code["steps"], y=code["loss"], mode="lines+markers", name="numpy code"),
            1,
            1,
        )
    if tasks is not None:
        for (kind, level), part in tasks.groupby(["kind", "level"]):
            fig.add_trace(
                go.Scatter(
                    x=part["steps"], y=part["accuracy"], mode="lines+markers",
                    name=f"{kind} {level}", line=dict(dash="solid" if part["trained_level"].iloc[0] else "dot"),
                ),
                1,
                3,
            )  # fmt: skip
    for difficulty, part in accuracy.groupby("difficulty"):
        fig.add_trace(
            go.Scatter(
                x=part["steps"],
                y=part["accuracy"],
                mode="lines+markers",
                name=f"{difficulty}-digit",
            ),
            1,
            2,
        )
    for col in (1, 2, 3):
        fig.update_xaxes(type="log", title_text="recurrence steps r", row=1, col=col)
        fig.add_vline(x=mean_recurrence, line_dash="dot", row=1, col=col)
    fig.update_yaxes(title_text="loss (nats/token)", row=1, col=1)
    fig.update_yaxes(title_text="exact-match accuracy", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="exact-match accuracy", range=[0, 1], row=1, col=3)
    fig.update_layout(height=440, width=1400, title="checkpoint evaluation")
    return fig


def code_summary(code: pd.DataFrame, mean_recurrence: int) -> dict:
    """Gain from r = 1 to r̄ and the relative change from r̄ to the deepest depth on held-out code."""
    by = code.set_index("steps")["loss"]
    deepest = int(by.index.max())
    return {
        "loss_r1": float(by[1]),
        "loss_rbar": float(by[mean_recurrence]),
        "deepest": deepest,
        "loss_deepest": float(by[deepest]),
        "gain_r1_to_rbar": float(1 - by[mean_recurrence] / by[1]),
        "change_rbar_to_deepest": float(by[deepest] / by[mean_recurrence] - 1),
    }


def markdown(losses, accuracy, spread, shares, probes, code=None, tasks=None, summary=None) -> str:
    acc = accuracy.pivot(index="difficulty", columns="steps", values="accuracy")
    acc.columns = [f"r={c}" for c in acc.columns]
    loss = losses.set_index("steps").T
    loss.columns = [f"r={c}" for c in loss.columns]
    extra = []
    if code is not None:
        table = code.set_index("steps")[["loss"]].T
        table.columns = [f"r={c}" for c in table.columns]
        extra.append(
            "Loss on held-out source code (numpy modules) by recurrence depth:\n\n"
            + table.to_markdown(floatfmt=".3f")
            + (
                f"\n\nGain from r = 1 to r̄: {summary['gain_r1_to_rbar']:.1%}; change from r̄ to "
                f"r = {summary['deepest']}: {summary['change_rbar_to_deepest']:+.1%}."
                if summary
                else ""
            )
        )
    if tasks is not None:
        table = tasks.pivot_table(index=["kind", "level"], columns="steps", values="accuracy")
        table.columns = [f"r={c}" for c in table.columns]
        extra.append(
            "Held-out depth tasks, exact-match accuracy (levels above the trained ones are held "
            "out whole):\n\n" + table.to_markdown(floatfmt=".2f")
        )
    return "\n\n".join(
        [
            "Validation loss by recurrence depth:\n\n" + loss.to_markdown(floatfmt=".3f"),
            *extra,
            "Held-out arithmetic accuracy (rows: digits per operand):\n\n"
            + acc.to_markdown(floatfmt=".2f"),
            "Path independence at 4r̄ (5 seeds):\n\n"
            + spread.to_markdown(index=False, floatfmt=".3f"),
            "Dynamics of all prompt tokens at 4r̄:\n\n"
            + shares.to_markdown(index=False, floatfmt=".2f"),
            "Linear probes (held-out accuracy):\n\n"
            + probes.to_markdown(index=False, floatfmt=".3f"),
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument("--out", default="eval/results")
    parser.add_argument("--data-cache", default="runs/eval-data")
    parser.add_argument("--val-batches", type=int, default=8)
    parser.add_argument("--problems", type=int, default=60, help="held-out problems per difficulty")
    parser.add_argument("--difficulties", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--code-rows", type=int, default=48, help="rows of numpy source (0: skip)")
    parser.add_argument("--task-problems", type=int, default=30, help="per kind/level (0: skip)")
    parser.add_argument("--task-kinds", nargs="+", default=list(DEFAULT_LEVELS))
    parser.add_argument("--task-max-level", type=int, default=16)
    return parser


def load_with_validation_data(checkpoint: Path, data_cache: str):
    """(model, its prepared corpus rebuilt from provenance.json, whether that corpus is the one the
    checkpoint was trained on); a mismatch is printed as a warning."""
    model = rm.load_model(checkpoint)
    provenance_path = checkpoint / "provenance.json"
    if not provenance_path.is_file():
        raise SystemExit(
            f"{provenance_path} is missing: it names the data the checkpoint was trained on"
        )
    provenance = json.loads(provenance_path.read_text())
    data = {**provenance["config"]["data"], "tokenizer_path": str(checkpoint / "tokenizer.json")}
    data_config = DataSection(**data).data_config()
    prepared = prepare_data(data_config, data_cache, progress=False)
    trained_on = provenance.get("corpus_hash")
    same_corpus = trained_on is None or trained_on == prepared.corpus_hash
    if not same_corpus:
        print(
            f"WARNING: the corpus rebuilt from the provenance's data config (hash "
            f"{prepared.corpus_hash[:12]}) is not the one the checkpoint was trained on "
            f"({trained_on[:12]}): the corpus code changed since, so the validation rows may differ "
            "from the checkpoint's validation split (and overlap its training rows)."
        )
    return model, prepared, same_corpus


def measure(model, prepared, args: argparse.Namespace) -> dict:
    """Every measurement of the evaluation, by name (None for a skipped one)."""
    r_mean = model.config.mean_recurrence
    depths = depth_grid(r_mean)
    loader = PackedLoader(prepared, "val", batch_size=8)
    m: dict = {"losses": validation_losses(model, loader, depths, args.val_batches)}
    m["accuracy"] = arithmetic_accuracy(model, depths, args.difficulties, args.problems)
    m["spread"], m["shares"] = trajectory_statistics(model, PROMPTS, 4 * r_mean, range(args.seeds))
    m["probes"] = probe_accuracies(model, r_mean, args.problems)
    code = heldout_code_losses(model, depths, max_rows=args.code_rows) if args.code_rows else None
    m["code"] = code
    m["summary"] = code_summary(code, r_mean) if code is not None else None
    levels = {
        kind: [lv for lv in DEFAULT_LEVELS[kind] if lv <= args.task_max_level]
        for kind in args.task_kinds
    }
    m["tasks"] = (
        depth_task_accuracy(model, depths, levels, n=args.task_problems)
        if args.task_problems
        else None
    )
    return m


def records(frame: pd.DataFrame | None) -> list[dict] | None:
    return None if frame is None else frame.to_dict("records")


def write_results(out: Path, results: dict, m: dict, r_mean: int) -> None:
    """results.json, results.md (also printed) and results.html in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(m["losses"], m["accuracy"], m["spread"], m["shares"], m["probes"],
                     m["code"], m["tasks"], m["summary"])  # fmt: skip
    (out / "results.md").write_text(table + "\n")
    plot(m["losses"], m["accuracy"], r_mean, m["code"], m["tasks"]).write_html(
        out / "results.html", include_plotlyjs="cdn"
    )
    print(table)
    print(
        f"\nwrote {out / 'results.json'}, results.md and results.html in {results['wall_s']:.0f} s"
    )


def main(argv: Sequence[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    checkpoint = Path(args.checkpoint)
    model, prepared, same_corpus = load_with_validation_data(checkpoint, args.data_cache)
    m = measure(model, prepared, args)
    results = {
        "checkpoint": str(checkpoint),
        "mean_recurrence": model.config.mean_recurrence,
        "validation_corpus_matches_training": same_corpus,
        "val_loss": records(m["losses"]),
        "arithmetic": records(m["accuracy"]),
        "path_independence": records(m["spread"]),
        "dynamics_share": records(m["shares"]),
        "probes": records(m["probes"]),
        "heldout_code": records(m["code"]),
        "heldout_code_summary": m["summary"],
        "depth_tasks": records(m["tasks"]),
        "wall_s": time.perf_counter() - started,
    }
    write_results(Path(args.out), results, m, model.config.mean_recurrence)
    return results


if __name__ == "__main__":
    main()
