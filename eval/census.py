"""Dynamics census: the kind of every token of held-out snippets at 4r̄, with several seeds.

Snippets (``--per-source`` of each, cut to ``--max-tokens``): numpy source code the model never saw
(``eval/heldout_code.py``), GSM8k-style word problems (prose) drawn with a seed the corpus does not use,
in the training frame ("Question: … Answer: …") and as bare sentences (plain_prose, like the app's
default prompt),
held-out arithmetic (``tasks.arithmetic``, heldout split) and held-out depth tasks (``tasks.depth``, at
trained and harder levels). Every token is classified with ``workbench.classify_dynamics`` on its
trajectory at 4r̄ iterations from each s_0 seed. Writes to --out:

- census.json: shares overall, by source, by token category, by seed; the period histogram of orbits;
  the tokens most often on orbits; agreement of a token's kind across seeds;
- census.md: the same as tables; census_tokens.csv.gz: one row per (snippet, seed, position).

    python eval/census.py --checkpoint checkpoints/default --out eval/results
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

import recurrent_model as rm
import workbench as wb
from tasks import arithmetic, depth
from workbench.dynamics import KINDS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heldout_code import numpy_sources  # noqa: E402

OPERATORS = set("+-*/%=<>!&|^~@")
CODE_SOURCES = {"code"}


def prose_snippets(n: int, seed: int) -> list[str]:
    """Word problems with their worked answers, from the corpus generators with an unused seed."""
    from pretrain.data import reasoning  # eval may import the training data generators

    rng = random.Random(f"census-prose:{seed}")
    out = []
    for _ in range(n):
        question, answer = rng.choice(reasoning.WORD_PROBLEMS)(rng)
        out.append(f"Question: {question}\nAnswer: {answer}")
    return out


def plain_prose_snippets(n: int, seed: int) -> list[str]:
    """The same kind of word problem as bare sentences: no "Question:" / "Answer:" frame, no answer
    (the app's default prompt is such a text)."""
    from pretrain.data import reasoning

    rng = random.Random(f"census-plain:{seed}")
    return [rng.choice(reasoning.WORD_PROBLEMS)(rng)[0] for _ in range(n)]


def code_snippets(n: int, seed: int) -> list[str]:
    """Consecutive 12-line windows of numpy modules (non-blank), one per file in hash order."""
    out = []
    for rel, text in numpy_sources(4 * n, seed):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) < 40:
            continue
        start = random.Random(f"{seed}:{rel}").randrange(len(lines) - 12)
        out.append("\n".join(lines[start : start + 12]))
        if len(out) == n:
            break
    return out


def arithmetic_snippets(n: int, seed: int) -> list[str]:
    """Three solved held-out problems per snippet, digits 1-4."""
    out = []
    for i in range(n):
        problems = arithmetic.make_problems(3, 1 + i % 4, seed + i, split="heldout")
        out.append("\n".join(arithmetic.render(p, a) for p, a in problems))
    return out


def depth_snippets(n: int, seed: int) -> list[str]:
    """Held-out depth tasks with answers, kinds in turn, levels 1 to two above the trained ones."""
    out = []
    for i in range(n):
        kind = depth.KINDS[i % len(depth.KINDS)]
        level = 1 + (i // len(depth.KINDS)) % (depth.TRAIN_LEVELS[kind] + 2)
        out.append(depth.make_tasks(kind, 1, level, seed + i, split="heldout")[0].render())
    return out


def token_category(token: str, source: str) -> str:
    """digit / operator / punctuation / identifier / word / whitespace / special / mixed."""
    text = token.strip()
    if token.startswith("<|") and token.endswith("|>"):
        return "special"
    if not text:
        return "whitespace"
    if text.isdigit():
        return "digit"
    if set(text) <= OPERATORS:
        return "operator"
    if not any(c.isalnum() for c in text):
        return "punctuation"
    if all(c.isalnum() or c == "_" for c in text):
        if "_" in text or any(c.isdigit() for c in text) or source in CODE_SOURCES:
            return "identifier"
        if source == "depth" and len(text) <= 2:
            return "identifier"  # variable names in the code tasks, node names in the graphs
        return "word"
    return "mixed"


def census(
    model: rm.RecurrentLM,
    snippets: dict[str, list[str]],
    num_steps: int,
    seeds: Sequence[int],
    max_tokens: int,
) -> pd.DataFrame:
    """One row per (source, snippet, seed, position) with the token, its category and its dynamics."""
    tok = model.tokenizer
    frames = []
    total = sum(map(len, snippets.values()))
    with tqdm(total=total, desc="census", unit="snippet") as bar:
        for source, texts in snippets.items():
            for index, text in enumerate(texts):
                ids = tok.encode(text)[:max_tokens]
                tokens = [tok.decode([i]) for i in ids]
                states = wb.collect(model, ids, num_steps, seeds=seeds, progress=False).states
                for run, seed in enumerate(seeds):
                    frame = wb.classify_dynamics(states[run], tokens=tokens)
                    frame = frame[["token", "kind", "period", "flip", "final_step_size"]].copy()
                    frame.insert(0, "position", np.arange(len(ids)))
                    frame.insert(0, "seed", seed)
                    frame.insert(0, "snippet", index)
                    frame.insert(0, "source", source)
                    frame["category"] = [token_category(t, source) for t in tokens]
                    frame["previous"] = ["<start>", *tokens[:-1]]
                    frames.append(frame)
                bar.update()
    return pd.concat(frames, ignore_index=True)


def shares(frame: pd.DataFrame, by: str | None) -> pd.DataFrame:
    """Share of each kind (columns), overall or per value of ``by`` (rows), with the token count."""
    if by is None:
        table = frame["kind"].value_counts(normalize=True).to_frame().T
        table.index = ["all"]
        table["tokens"] = len(frame)
    else:
        table = pd.crosstab(frame[by], frame["kind"], normalize="index")
        table["tokens"] = frame[by].value_counts()
    for kind in KINDS:
        if kind not in table:
            table[kind] = 0.0
    step = frame["final_step_size"] if by is None else frame.groupby(by)["final_step_size"]
    table["median_final_step"] = step.median()
    return table[[*KINDS, "tokens", "median_final_step"]]


def snippet_orbit_shares(frame: pd.DataFrame) -> pd.DataFrame:
    """Per source: the share of (snippet, seed) runs whose tokens orbit not at all / < 20 % / 20-80 % /
    > 80 %, and the median position of the first orbiting token (is a flip a property of the context?)."""
    frame = frame.assign(
        group=np.where(
            frame["source"] == "depth",
            "depth:" + frame["snippet"].map(lambda i: depth.KINDS[i % len(depth.KINDS)]),
            frame["source"],
        )
    )
    orbit = (
        (frame["kind"] == "orbit").groupby([frame["group"], frame["snippet"], frame["seed"]]).mean()
    )
    bins = pd.cut(orbit, [-0.01, 0.0, 0.2, 0.8, 1.0], labels=["none", "<20%", "20-80%", ">80%"])
    table = pd.crosstab(orbit.index.get_level_values(0), bins, normalize="index")
    table = table.reindex(columns=list(bins.cat.categories), fill_value=0.0)
    first = frame[frame["kind"] == "orbit"].groupby(["group", "snippet", "seed"])["position"].min()
    table["median_first_orbit_position"] = first.groupby(level=0).median()
    table.index.name = "source"
    return table


def summarise(frame: pd.DataFrame) -> dict:
    """The census numbers: shares overall / by source / by category / by seed, periods, top tokens."""
    orbits = frame[frame["kind"] == "orbit"]
    periods = orbits["period"].round(0).clip(upper=16).value_counts().sort_index()
    per_token = frame.pivot_table(
        index=["source", "snippet", "position"], columns="seed", values="kind", aggfunc="first"
    )
    agreement = float((per_token.nunique(axis=1) == 1).mean())
    top = (
        frame.assign(is_orbit=frame["kind"] == "orbit")
        .groupby("token")["is_orbit"]
        .agg(["mean", "size"])
        .query("size >= 20")
        .sort_values("mean", ascending=False)
    )
    flips = float(orbits["flip"].mean()) if len(orbits) else float("nan")
    slowest = (
        frame.groupby("token")["final_step_size"]
        .agg(["median", "size"])
        .query("size >= 20")
        .sort_values("median", ascending=False)
    )
    return {
        "tokens": len(frame),
        "snippets": int(frame.groupby(["source", "snippet"]).ngroups),
        "seeds": sorted(frame["seed"].unique().tolist()),
        "overall": shares(frame, None).iloc[0].to_dict(),
        "by_source": shares(frame, "source").to_dict("index"),
        "by_category": shares(frame, "category").to_dict("index"),
        "by_seed": shares(frame, "seed").to_dict("index"),
        "snippets_by_orbit_share": snippet_orbit_shares(frame).to_dict("index"),
        "orbit_period_histogram": {str(int(k)): int(v) for k, v in periods.items()},
        "orbit_share_period_2": flips,
        "kind_agrees_across_seeds": agreement,
        "orbit_prone_tokens": top.head(15).reset_index().to_dict("records"),
        "fixed_point_prone_tokens": top.tail(15).reset_index().to_dict("records"),
        "slowest_settling_tokens": slowest.head(15).reset_index().to_dict("records"),
    }


def markdown(summary: dict, frame: pd.DataFrame) -> str:
    def table(name: str) -> str:
        return pd.DataFrame(summary[name]).T.to_markdown(floatfmt=".3f")

    periods = pd.Series(summary["orbit_period_histogram"], name="orbits").to_frame()
    periods.index.name = "period (steps, 16 = ≥16)"
    top = pd.DataFrame(summary["orbit_prone_tokens"]).rename(columns={"mean": "orbit share"})
    slow = pd.DataFrame(summary["slowest_settling_tokens"])
    for listed in (top, slow):
        if len(listed):
            listed["token"] = listed["token"].map(repr)
    return "\n\n".join(
        [
            f"Dynamics census: {summary['tokens']} token trajectories ({summary['snippets']} snippets "
            f"× seeds {summary['seeds']}); a token's kind is the same for every seed in "
            f"{summary['kind_agrees_across_seeds']:.1%} of positions.",
            "Overall:\n\n"
            + pd.DataFrame([summary["overall"]]).to_markdown(index=False, floatfmt=".3f"),
            "By source:\n\n" + table("by_source"),
            "Runs (snippet × seed) by the share of their tokens on orbits; depth tasks by kind:\n\n"
            + table("snippets_by_orbit_share"),
            "By token category:\n\n" + table("by_category"),
            "By seed:\n\n" + table("by_seed"),
            "Orbit periods:\n\n" + periods.to_markdown(),
            "Tokens most often on orbits (≥ 20 occurrences):\n\n"
            + top.to_markdown(index=False, floatfmt=".3f"),
            "Tokens whose state still moves most at the last step (median ‖s_r − s_{r−1}‖/‖s_r‖, "
            "≥ 20 occurrences):\n\n" + slow.to_markdown(index=False, floatfmt=".2e"),
        ]
    )


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument("--out", default="eval/results")
    parser.add_argument("--per-source", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="default 4r̄")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--from-tokens", default=None, help="re-summarise a census_tokens.csv.gz")
    args = parser.parse_args(argv)
    if args.from_tokens:
        frame = pd.read_csv(args.from_tokens, keep_default_na=False, na_values=[""])
        previous = json.loads((Path(args.out) / "census.json").read_text())
        summary = {k: previous[k] for k in ("checkpoint", "num_steps", "wall_s") if k in previous}
        summary.update(summarise(frame))
        (Path(args.out) / "census.json").write_text(
            json.dumps(summary, indent=2, default=float) + "\n"
        )
        (Path(args.out) / "census.md").write_text(markdown(summary, frame) + "\n")
        print(markdown(summary, frame))
        return summary
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model = rm.load_model(args.checkpoint)
    num_steps = args.steps or 4 * model.config.mean_recurrence
    n = args.per_source
    snippets = {
        "code": code_snippets(n, 0),
        "prose": prose_snippets(n, 777),
        "plain_prose": plain_prose_snippets(n, 778),
        "arithmetic": arithmetic_snippets(n, 9000),
        "depth": depth_snippets(n, 5000),
    }
    frame = census(model, snippets, num_steps, list(range(args.seeds)), args.max_tokens)
    summary = {"checkpoint": args.checkpoint, "num_steps": num_steps, **summarise(frame)}
    summary["wall_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "census.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    (out / "census.md").write_text(markdown(summary, frame) + "\n")
    frame.to_csv(out / "census_tokens.csv.gz", index=False)
    print(markdown(summary, frame))
    return summary


if __name__ == "__main__":
    main()
