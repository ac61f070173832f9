"""The numbers docs/workbench.md quotes about checkpoints/default, printed and written to a JSON file.

1. Dynamics at the app's default 32 steps on the app's default prompt (seed 0, init_scale 1): settled
   and converging fixed points, the largest last-4-steps relative step of a settled token, the
   converging tokens' last relative step (range and the three largest), and the last-third /
   first-third mean step (``step_decay``) of the alternating tokens the doc names.
2. The default patching pair at 32 steps from s_0 = 0 (logit difference of the two answers): each
   run's answer probabilities, the logit differences and their gap; the core-state grid at s_32 and
   s_31, the largest cell before step 30, every position patched at once; the prelude output
   (``hook_e``) patched at each position.
3. Zeroing (and negating) one token's core state at every step on the default prompt, 32 steps,
   s_0 = 0: the KL(baseline ‖ ablated) at the last position (range and median over every token but
   the last, the digit "3"), at the
   zeroed position, at the next one, and its mean from the token on; the baseline's p("\\n").

    OMP_NUM_THREADS=1 .venv/bin/python eval/workbench_findings.py [--out eval/results/workbench_findings.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import recurrent_model as rm
import workbench
from recurrent_model.hook_names import STATE, E
from tasks.arithmetic import DEFAULT_PATCHING_PAIR
from workbench.dynamics import dynamics_labels
from workbench.patching import patching_pair

ROOT = Path(__file__).resolve().parents[1]
PROMPT = (
    "Claire makes a 3 egg omelet every morning for breakfast. How many dozens of eggs will she eat "
    "in 4 weeks?"
)  # the app's default prompt
STEPS = 32
#: The converging tokens docs/workbench.md names as alternating from step to step.
ALTERNATING = (" many", " do", " will", "he")


def dynamics_findings(model: rm.RecurrentLM) -> dict[str, float]:
    """Settled and converging tokens at STEPS iterations, as the app's Dynamics tab labels them."""
    ids = model.tokenizer.encode(PROMPT)
    traj = workbench.collect(model, ids, STEPS, seeds=(0,), init_scale=1.0, progress=False)
    verdicts = workbench.classify_dynamics(traj.states[0])
    labels = dynamics_labels(verdicts)
    settled, moving = verdicts[labels == "fixed_point"], verdicts[labels == "converging"]
    pieces = model.tokenizer.token_strings(ids)
    top = moving["final_step_size"].sort_values(ascending=False).head(3)
    for position, step in top.items():
        print(f"[1] converging {pieces[int(position)]!r}: {100 * step:.1f} % a step")
    out = {"tokens": len(ids), "settled": len(settled), "converging": len(moving),
           "settled_tail_max": settled["max_tail_relative_step"].max(),
           "converging_min_pct": 100 * moving["final_step_size"].min(),
           "converging_max_pct": 100 * moving["final_step_size"].max()}  # fmt: skip
    out |= {f"converging_top{i}_pct": 100 * v for i, v in enumerate(top.to_numpy())}
    named = verdicts[[piece in ALTERNATING for piece in pieces]]["step_decay"]
    if len(named) != len(ALTERNATING):
        raise SystemExit(f"expected the tokens {ALTERNATING} once each, found {len(named)}")
    out |= {"alternating_decay_min": named.min(), "alternating_decay_max": named.max()}
    print(f"[1] {out}")
    return {f"dynamics.{k}": float(v) for k, v in out.items()}


def patching_findings(model: rm.RecurrentLM) -> dict[str, float]:
    """The default pair's answers, its core-state grid and its hook_e patches."""
    pair = patching_pair(model, DEFAULT_PATCHING_PAIR)
    clean, corrupted = list(pair.clean_ids), list(pair.corrupted_ids)
    out: dict[str, float] = {}
    with torch.inference_mode():
        for name, ids in (("clean", clean), ("corrupted", corrupted)):
            logits = model(torch.tensor([ids]), num_steps=STEPS, init_scale=0.0).logits[0, -1]
            probs = logits.softmax(-1)
            out |= {f"{name}.p_clean_answer": probs[pair.target],
                    f"{name}.p_corrupted_answer": probs[pair.corrupted_target]}  # fmt: skip
    kwargs = dict(metric="logit_diff", target=pair.target, corrupted_target=pair.corrupted_target)
    grid = workbench.patch_states(model, clean, corrupted, STEPS, **kwargs)
    table = grid.pivot(index="position", columns="step", values="restored")
    where = next(i for i, (a, b) in enumerate(zip(clean, corrupted, strict=True)) if a != b)
    everywhere = workbench.patch_states(model, clean, corrupted, STEPS, positions="all", **kwargs)
    prelude = workbench.patch_states(model, clean, corrupted, STEPS, hook=E, **kwargs)
    by_e = prelude.groupby("position")["restored"].max()
    out |= {"m_clean": grid["clean"].iloc[0], "m_corrupted": grid["corrupted"].iloc[0],
            "gap": grid["clean"].iloc[0] - grid["corrupted"].iloc[0], "operand": where,
            "s32.operand": table.loc[where, STEPS], "s32.last": table.loc[len(clean) - 1, STEPS],
            "s32.before_last": table.loc[len(clean) - 2, STEPS],
            "s31.operand": table.loc[where, STEPS - 1],
            "before30_max": table.loc[:, table.columns < 30].abs().to_numpy().max(),
            "all_positions": everywhere["restored"].iloc[-1], "hook_e.operand": by_e.loc[where],
            "hook_e.others_max": by_e.drop(where).abs().max()}  # fmt: skip
    print(f"[2] {out}")
    return {f"patching.{k}": float(v) for k, v in out.items()}


def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) along the last axis from log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def ablated_logprobs(model: rm.RecurrentLM, x: torch.Tensor, position: int, factor: float):
    """Log-probabilities with token ``position``'s core state times ``factor`` at every step."""

    def hook(state, hook_point):
        state = state.clone()
        state[:, position] *= factor
        return state

    with model.hooks([(STATE, hook)]), torch.inference_mode():
        return model(x, num_steps=STEPS, init_scale=0.0).logits[0].log_softmax(-1)


def zeroing_findings(model: rm.RecurrentLM) -> dict[str, float]:
    """KL at the last position, the zeroed one, the next one and from the token on, per token."""
    ids = model.tokenizer.encode(PROMPT)
    x = torch.tensor([ids])
    with torch.inference_mode():
        base = model(x, num_steps=STEPS, init_scale=0.0).logits[0].log_softmax(-1)
    digit = [s.strip() for s in model.tokenizer.token_strings(ids)].index("3")
    out: dict[str, float] = {"p_newline": float(base[-1].exp().max())}
    for name, factor in (("zero", 0.0), ("negate", -1.0)):
        rows = []
        for p in range(len(ids)):
            by_position = kl(base, ablated_logprobs(model, x, p, factor)).numpy()
            after = by_position[p + 1] if p + 1 < len(ids) else np.nan
            rows.append((by_position[-1], by_position[p], after, by_position[p:].mean()))
        last, own, nxt, mean_on = np.array(rows).T
        others = last[:-1]  # the last token's own ablation is its own prediction, not a readout
        out |= {f"{name}.last_min": others.min(), f"{name}.last_max": others.max(),
                f"{name}.last_median": np.median(others), f"{name}.last_digit": last[digit]}  # fmt: skip
        if name == "zero":
            out |= {"zero.own_min": own[:-1].min(), "zero.own_max": own[:-1].max(),
                    "zero.own_last": own[-1], "zero.next_max": np.nanmax(nxt[1:]),
                    "zero.next_after_first": nxt[0], "zero.mean_on_min": mean_on[:-1].min(),
                    "zero.mean_on_max": mean_on[:-1].max()}  # fmt: skip
    print(f"[3] {out}")
    return {f"zeroing.{k}": float(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "default"))
    parser.add_argument(
        "--out", type=Path, default=ROOT / "eval" / "results" / "workbench_findings.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = rm.load_model(args.checkpoint).eval()
    values = dynamics_findings(model) | patching_findings(model) | zeroing_findings(model)
    record = {"script": "eval/workbench_findings.py", "checkpoint": model.name, "values": values}
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(values)} numbers to {args.out}")


if __name__ == "__main__":
    main()
