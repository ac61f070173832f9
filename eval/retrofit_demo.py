"""Retrofitted recurrence against training from scratch at equal training FLOPs, on this machine.

    python eval/retrofit_demo.py [--size demo|tiny] [--seeds 0 1] [--out DIR] [--publish]

Per seed, on the starter corpus (one tokenizer for every run):

1. **Llama**: a small plain Llama (eval/plain_llama.py, ``LlamaForCausalLM`` layout) trained from
   Huginn's initialisation, saved as a Hugging Face directory;
2. **retrofitted**: ``python -m pretrain.retrofit`` converts it (prelude, core and coda, the
   published adapter drawn from the seed), and ``pretrain/launch.py --init-from`` trains on with the
   published 1-sqrt recurrence curriculum;
3. **from scratch**: the same retrofitted shape from Huginn's initialisation, trained by the same
   launch.py route (``--init-from`` of the unconverted weights), with the same curriculum as a
   fraction of its run, for as many steps as make its training FLOPs equal the Llama's plus the
   retrofitted run's (the one cost model: ``ModelCost.train_flops_per_token`` at every step's drawn
   depth, pretrain/plan_compute.py).

Both recurrent models are evaluated on the pipeline's held-out batches at r = 1, 4, 16 and 32 (the
final validation of their runs); the Llama on the same batches. OUT/results.json holds every number
and setting, OUT/table.md the table, OUT/retrofit_demo.png the figure; ``--publish`` also writes
them to eval/results/retrofit_demo.json, eval/results/retrofit_demo.md and
docs/images/retrofit_demo.png; ``--report-only --out OUT`` redraws the table and figure of an
earlier run from its results.json. ``--size tiny`` is the test's size (tests/test_retrofit_demo.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from eval.plain_llama import (  # noqa: E402
    LlamaShape,
    PlainLlama,
    Recipe,
    heldout_loss,
    init_weights,
    save_llama,
    train_llama,
)
from pretrain.config import TrainConfig, load_config  # noqa: E402
from pretrain.launch import main as launch_main  # noqa: E402
from pretrain.plan_compute import compute_plan  # noqa: E402
from pretrain.retrofit import convert  # noqa: E402
from recurrent_model.retrofit import RetrofitConfig, RetrofitLM  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEPTHS = (1, 4, 16, 32)
ROUTES = ("retrofitted", "scratch")


@dataclass(frozen=True)
class Size:
    """Every setting of one demo size."""

    llama: LlamaShape
    parts: tuple[int, int, int]  # prelude, core, coda of the conversion
    starter_size: str
    llama_steps: int
    retrofit_steps: int
    curriculum_fraction: float  # of each recurrent run's steps
    target_recurrence: int
    backprop_depth: int
    micro_batch_size: int
    lr: float
    val_batches: int
    threads: int


SIZES = {
    "demo": Size(
        LlamaShape(
            n_embd=64,
            n_heads=4,
            num_key_value_heads=2,
            n_layers=6,
            intermediate_size=192,
            vocab_size=2048,
            block_size=64,
        ),  # fmt: skip
        parts=(2, 2, 2),
        starter_size="small",
        llama_steps=300,
        retrofit_steps=150,
        curriculum_fraction=0.5,
        target_recurrence=8,
        backprop_depth=4,
        micro_batch_size=8,
        lr=2e-3,
        val_batches=4,
        threads=2,
    ),  # fmt: skip
    "tiny": Size(
        LlamaShape(
            n_embd=32,
            n_heads=2,
            num_key_value_heads=1,
            n_layers=3,
            intermediate_size=64,
            vocab_size=320,
            block_size=32,
        ),  # fmt: skip
        parts=(1, 1, 1),
        starter_size="tiny",
        llama_steps=6,
        retrofit_steps=4,
        curriculum_fraction=0.5,
        target_recurrence=4,
        backprop_depth=2,
        micro_batch_size=2,
        lr=3e-3,
        val_batches=2,
        threads=1,
    ),  # fmt: skip
}


# Configs ----------------------------------------------------------------------------------------
def train_config(size: Size, root: Path, tokenizer: Path | None, seed: int, steps: int) -> dict:
    """The launch.py config of one recurrent run (and of the shared data)."""
    warmup = max(1, steps // 10)
    return {
        "data": {
            "sources": ["starter"],
            "starter_size": size.starter_size,
            "vocab_size": size.llama.vocab_size,
            "block_size": size.llama.block_size,
            "val_fraction": 0.05,
            "cache_dir": str(root / "data"),
            "tokenizer_path": None if tokenizer is None else str(tokenizer),
        },
        "train": {
            "max_steps": steps,
            "micro_batch_size": size.micro_batch_size,
            "lr": size.lr,
            "warmup_steps": warmup,
            "cooldown_steps": warmup,
            "seed": seed,
            "backprop_depth": size.backprop_depth,
            "recurrence_curriculum": {
                "shape": "1-sqrt",
                "start": 0,
                "steps": max(1, round(size.curriculum_fraction * steps)),
                "target": size.target_recurrence,
            },
            "checkpoint_every": steps,
            "keep_last": 1,
            "log_every": 1,
            "health_every": steps,
            "val_every": steps,
            "val_batches": size.val_batches,
            "val_depths": list(DEPTHS),
            "progress": False,
            "tensorboard": False,
            "threads": size.threads,
            "device": "cpu",
            "precision": "fp32",
        },
    }


def write_config(path: Path, raw: dict) -> Path:
    path.write_text(json.dumps(raw, indent=2))  # JSON is YAML
    return path


def shared_tokenizer(size: Size, root: Path) -> Path:
    """Train the data pipeline's tokenizer on the starter corpus once; its tokenizer.json."""
    from pretrain.data import open_prepared

    target = root / "tokenizer" / "tokenizer.json"
    if target.is_file():
        return target
    config = load_config(
        write_config(root / "tokenizer.yaml", train_config(size, root, None, 0, 1))
    )
    raw = config.data.data_config()
    prepared = open_prepared(raw, root / "tokenizer-data", build=True, progress=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(prepared.tokenizer_path, target)
    shutil.rmtree(root / "tokenizer-data")
    return target


# The stages -------------------------------------------------------------------------------------
def run_launch(args: list[str]) -> None:
    """``pretrain/launch.py`` in this process; RuntimeError with its output when it fails."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = launch_main(args)
    if code != 0:
        raise RuntimeError(f"launch.py {' '.join(args)} failed ({code}): {err.getvalue()[-2000:]}")


def final_validation(run: Path) -> dict[str, float]:
    """val_loss at each depth of the run's last metrics record."""
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {str(d): last[f"val_loss_{d}"] for d in DEPTHS}


def llama_stage(size: Size, root: Path, config: TrainConfig, seed: int) -> dict[str, Any]:
    """Train and save the Llama; its held-out loss and FLOPs."""
    from pretrain.data import PackedLoader, open_prepared

    prepared = open_prepared(config.data.data_config(), root / "data", build=True, progress=False)
    torch.manual_seed(seed)
    model = PlainLlama(size.llama)
    init_weights(model, size.llama.n_embd, size.llama.n_layers, seed)
    warmup = max(1, size.llama_steps // 10)
    recipe = Recipe(size.llama_steps, size.micro_batch_size, size.lr, warmup, warmup)
    losses, flops = train_llama(model, prepared, recipe, seed)
    val = PackedLoader(prepared, "val", size.micro_batch_size, 0, 1, seed=0)
    batches = [batch for batch, _ in zip(val, range(size.val_batches), strict=False)]
    directory = save_llama(model, root / f"seed{seed}" / "llama", Path(config.data.tokenizer_path))
    return {"directory": str(directory), "flops": flops, "steps": size.llama_steps,
            "train_loss_last": losses[-1], "heldout_loss": heldout_loss(model, batches)}  # fmt: skip


def scratch_checkpoint(converted: Path, out: Path, seed: int) -> Path:
    """The converted model's shape from Huginn's initialisation, saved as a checkpoint."""
    raw = json.loads((converted / "config.json").read_text())
    raw.pop("retrofit_conversion", None)
    config = RetrofitConfig.from_dict(raw)
    config.name = out.name
    model = RetrofitLM(config)
    init_weights(model, config.n_embd, config.n_layers, seed)
    model.save_pretrained(out)
    shutil.copyfile(converted / "tokenizer.json", out / "tokenizer.json")
    return out


def steps_for_flops(
    raw: dict, path: Path, start: Path, budget: float, fraction: float
) -> tuple[int, float]:
    """The fewest steps whose planned FLOPs for the model of ``start`` (curriculum scaled to
    ``fraction`` of the run) reach ``budget``; (steps, their FLOPs)."""

    def flops(steps: int) -> float:
        train = dict(raw["train"], max_steps=steps, checkpoint_every=steps, health_every=steps,
                     val_every=steps, warmup_steps=max(1, steps // 10),
                     cooldown_steps=max(1, steps // 10))  # fmt: skip
        train["recurrence_curriculum"] = dict(train["recurrence_curriculum"],
                                              steps=max(1, round(fraction * steps)))  # fmt: skip
        config = load_config(write_config(path, {**raw, "train": train}), [], str(start))
        return compute_plan(config, world=1, device_name="cpu", bf16=False).flops

    low, high = 1, 2
    while flops(high) < budget:
        low, high = high, 2 * high
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if flops(middle) < budget else (low, middle)
    return high, flops(high)


def recurrent_run(raw: dict, directory: Path, start: Path) -> dict[str, Any]:
    """launch.py --init-from START with ``raw``; its planned FLOPs and final validation."""
    directory.mkdir(parents=True)
    path = write_config(directory / "config.yaml", raw)
    run = directory / "run"
    run_launch(["--config", str(path), "--out", str(run), "--init-from", str(start)])
    config = load_config(path, [], str(start))
    plan = compute_plan(config, world=1, device_name="cpu", bf16=False)
    return {"steps": config.train.max_steps, "flops": plan.flops, "run": str(run),
            "curriculum": config.train.recurrence_curriculum,
            "heldout_loss": final_validation(run)}  # fmt: skip


def one_seed(size: Size, root: Path, tokenizer: Path, seed: int) -> dict[str, Any]:
    """The three stages of one seed."""
    base = root / f"seed{seed}"
    base.mkdir(parents=True)
    retro_raw = train_config(size, root, tokenizer, seed, size.retrofit_steps)
    config = load_config(write_config(base / "data.yaml", retro_raw))
    llama = llama_stage(size, root, config, seed)
    converted = convert(llama["directory"], base / "converted", *size.parts, seed=seed)
    retrofitted = recurrent_run(retro_raw, base / "retrofitted", converted)
    budget = llama["flops"] + retrofitted["flops"]
    scratch_start = scratch_checkpoint(converted, base / "scratch-init", seed)
    steps, _ = steps_for_flops(
        train_config(size, root, tokenizer, seed, 1), base / "search.yaml", scratch_start, budget,
        size.curriculum_fraction,
    )  # fmt: skip
    scratch = recurrent_run(train_config(size, root, tokenizer, seed, steps), base / "scratch",
                            scratch_start)  # fmt: skip
    return {"seed": seed, "llama": llama, "retrofitted": retrofitted, "scratch": scratch,
            "retrofitted_total_flops": budget}  # fmt: skip


# Reporting --------------------------------------------------------------------------------------
def summary(seeds: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """route -> depth -> the held-out loss of every seed."""
    return {
        route: {str(d): [s[route]["heldout_loss"][str(d)] for s in seeds] for d in DEPTHS}
        for route in ROUTES
    }


def cell(values: list[float]) -> str:
    """mean (min–max over seeds)."""
    mean = sum(values) / len(values)
    return f"{mean:.3f} ({min(values):.3f}–{max(values):.3f})"


def table(results: dict[str, Any]) -> str:
    """The markdown table: held-out loss by depth for both routes, the Llama, the FLOPs."""
    seeds, losses = results["seeds"], summary(results["seeds"])
    names = {"retrofitted": "retrofitted (Llama, then curriculum)", "scratch": "from scratch"}
    lines = ["| model | " + " | ".join(f"r = {d}" for d in DEPTHS) + " | training FLOPs |",
             "|---|" + "---|" * (len(DEPTHS) + 1)]  # fmt: skip
    for route in ROUTES:
        flops = [s["retrofitted_total_flops"] if route == "retrofitted" else s[route]["flops"]
                 for s in seeds]  # fmt: skip
        row = " | ".join(cell(losses[route][str(d)]) for d in DEPTHS)
        lines.append(f"| {names[route]} | {row} | {sum(flops) / len(flops):.3g} |")
    llama = cell([s["llama"]["heldout_loss"] for s in seeds])
    llama_flops = sum(s["llama"]["flops"] for s in seeds) / len(seeds)
    lines.append(f"| the Llama it started from (no recurrence: one value) | {llama} |"
                 + " — |" * (len(DEPTHS) - 1) + f" {llama_flops:.3g} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(results: dict[str, Any], path: Path) -> None:
    """Held-out loss against r for both routes (mean, bars from min to max over seeds), the
    Llama's loss as a dashed line; written as PNG."""
    import plotly.graph_objects as go

    losses = summary(results["seeds"])
    fig = go.Figure()
    names = {"retrofitted": "retrofitted", "scratch": "from scratch"}
    for route, color in zip(ROUTES, ("#1f77b4", "#d62728"), strict=True):
        values = [losses[route][str(d)] for d in DEPTHS]
        means = [sum(v) / len(v) for v in values]
        fig.add_trace(go.Scatter(
            x=list(DEPTHS), y=means, name=names[route], mode="lines+markers", line={"color": color},
            error_y={"type": "data", "symmetric": False,
                     "array": [max(v) - m for v, m in zip(values, means, strict=True)],
                     "arrayminus": [m - min(v) for v, m in zip(values, means, strict=True)]},
        ))  # fmt: skip
    llama = [s["llama"]["heldout_loss"] for s in results["seeds"]]
    fig.add_hline(y=sum(llama) / len(llama), line_dash="dash", line_color="gray",
                  annotation_text="the Llama it started from", annotation_position="bottom right")  # fmt: skip
    every = [v for route in ROUTES for d in DEPTHS for v in losses[route][str(d)]] + llama
    low, high = min(every), max(every)
    seeds = ", ".join(str(s["seed"]) for s in results["seeds"])
    fig.update_layout(
        title=f"Held-out loss at equal training FLOPs (seeds {seeds}; bars: min to max)",
        xaxis={"title": "recurrence r at evaluation", "type": "log", "tickvals": list(DEPTHS)},
        yaxis={"title": "held-out loss (nats/token)",
               "range": [low - 0.1 * (high - low), high + 0.05 * (high - low)]},
        width=760, height=460,
        template="plotly_white",
    )  # fmt: skip
    fig.write_image(str(path))


def publish(out: Path) -> None:
    """Copy the results, table and figure to where the docs read them."""
    shutil.copyfile(out / "results.json", REPO / "eval" / "results" / "retrofit_demo.json")
    shutil.copyfile(out / "table.md", REPO / "eval" / "results" / "retrofit_demo.md")
    shutil.copyfile(out / "retrofit_demo.png", REPO / "docs" / "images" / "retrofit_demo.png")


def report(out: Path, results: dict[str, Any]) -> None:
    """OUT/table.md and OUT/retrofit_demo.png from the results."""
    (out / "table.md").write_text(table(results))
    figure(results, out / "retrofit_demo.png")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="demo")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", default="runs/retrofit_demo", help="a new directory")
    parser.add_argument("--publish", action="store_true", help="copy the outputs into the repo")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="redraw the table and figure of an earlier --out from its results.json (no training)",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        results = json.loads((Path(args.out) / "results.json").read_text())
        report(Path(args.out), results)
        if args.publish:
            publish(Path(args.out))
        print(table(results), end="")
        return results
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"error: {out} exists; the demo writes a new directory")
    size = SIZES[args.size]
    out.mkdir(parents=True)
    torch.set_num_threads(size.threads)
    started = time.perf_counter()
    tokenizer = shared_tokenizer(size, out)
    seeds = [one_seed(size, out, tokenizer, seed) for seed in args.seeds]
    settings = asdict(replace(size))
    results = {"size": args.size, "settings": settings, "depths": list(DEPTHS), "seeds": seeds,
               "wall_s": time.perf_counter() - started, "torch": torch.__version__}  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    report(out, results)
    if args.publish:
        publish(out)
    print(table(results), end="")
    print(f"{out}: results.json, table.md, retrofit_demo.png ({results['wall_s']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
