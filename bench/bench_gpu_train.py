"""Train the gpu-single config on one GPU (CUDA or ROCm) and report MFU and peak memory against the
memory plan, side by side in one run.

What it does: trains pretrain/configs/gpu-single.yaml (bf16 autocast, compiled blocks, checkpointed
core iterations) for ``--steps`` steps through pretrain/launch.py's ``train`` on the starter corpus,
with validation, health and checkpoints pushed to the end; then reads the run's metrics.jsonl:

- MFU: the trainer's model FLOP/s per device (pretrain.metrics.flops_per_token at the sampled depth,
  no recompute counted) over the device's dense bf16 peak (pretrain.metrics.PEAK_FLOPS_BF16), as the
  median over the steps after ``--warmup`` (compilation); goal >= 45 %.
- memory: torch.cuda.max_memory_allocated over the training steps (before the final validation)
  against the plan's total without its allocator margin (pretrain.plan.plan_memory for this device,
  one rank), and torch.cuda.max_memory_reserved against the plan's total with it.

On a machine without a GPU it says so and exits 0 without measuring anything.

Usage: python bench/bench_gpu_train.py [--steps 300] [--warmup 30] [--out DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pretrain.config import load_config  # noqa: E402
from pretrain.plan import GIB, Device, plan_memory, resolve_device  # noqa: E402

CONFIG = ROOT / "pretrain" / "configs" / "gpu-single.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--warmup", type=int, default=30, help="steps left out of the MFU median")
    p.add_argument("--config", default=str(CONFIG))
    p.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line too")
    return p.parse_args(argv)


def this_device() -> Device:
    """The plan's device for GPU 0: the table entry its name matches, else its total memory."""
    name = torch.cuda.get_device_name(0)
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    try:
        return resolve_device(name)
    except ValueError:
        return resolve_device(name, total)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no GPU visible (CUDA or ROCm): nothing to measure; run this on a GPU machine")
        return 0
    overrides = [
        *args.overrides,
        f"train.max_steps={max(args.steps, 1)}",
        "train.log_every=1",
        "train.progress=false",
        f"train.val_every={10**9}",
        f"train.health_every={10**9}",
        f"train.checkpoint_every={10**9}",
    ]
    config = load_config(args.config, overrides)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_gpu_train_"))
    from pretrain.launch import train

    torch.cuda.reset_peak_memory_stats()
    code = train(config, out, max_steps=args.steps)
    if code != 0:
        print(f"training failed with exit code {code}")
        return code
    reserved = torch.cuda.max_memory_reserved() / GIB
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if not any(k.startswith("val_loss_") for k in r)]
    steady = [r for r in train_rows if r["step"] > args.warmup] or train_rows
    mfu = [r["mfu"] for r in steady if "mfu" in r]
    peak = max(r.get("mem_gib", 0.0) for r in train_rows)
    device = this_device()
    plan = plan_memory(config, device, nodes=1, gpus_per_node=1)
    margin = sum(r.bytes for r in plan.rows if r.name.startswith("allocator margin"))
    planned = (plan.total_bytes - margin) / GIB
    result = {
        "device": torch.cuda.get_device_name(0),
        "hip": torch.version.hip,
        "steps": len(train_rows),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "mfu_median": statistics.median(mfu) if mfu else None,
        "peak_allocated_gib": peak,
        "peak_reserved_gib": reserved,
        "plan_without_margin_gib": planned,
        "plan_total_gib": plan.total_bytes / GIB,
        "measured_over_plan": peak / planned if planned else None,
        "loss_first_last": [train_rows[0]["loss"], train_rows[-1]["loss"]],
    }
    print(
        f"device {result['device']} (ROCm {result['hip']})" if result["hip"] else result["device"]
    )
    print(
        f"{result['steps']} steps, median {result['tokens_per_s']:.0f} tokens/s, "
        f"MFU {100 * (result['mfu_median'] or 0):.1f}% (goal >= 45%)"
    )
    print(
        f"peak allocated {peak:.2f} GiB vs plan {planned:.2f} GiB without margin "
        f"(ratio {result['measured_over_plan']:.2f}); peak reserved {reserved:.2f} GiB vs plan "
        f"{result['plan_total_gib']:.2f} GiB with margin"
    )
    print(f"loss {result['loss_first_last'][0]:.3f} -> {result['loss_first_last'][1]:.3f}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
