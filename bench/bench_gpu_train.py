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
- state dtypes under fsdp: the config's model FSDP2-sharded over a one-rank mesh on this GPU with
  the run's policy (pretrain.distributed.shard_model), one forward under the run's autocast, and the
  dtypes of e, s_0 … s_r, the residual stream and the gathered norm weights (all float32 in the
  recipe) beside a matmul output (bf16).

On a machine without a GPU it refuses in one line (exit 2) without measuring anything.

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

from cluster.context import DistContext  # noqa: E402
from pretrain.config import load_config  # noqa: E402
from pretrain.distributed import (  # noqa: E402
    flat_mesh,
    init_parameters,
    materialise,
    shard_model,
)
from pretrain.plan import GIB, Device, plan_memory, resolve_device  # noqa: E402
from pretrain.precision import Precision, resolve_precision  # noqa: E402
from recurrent_model import RecurrentConfig, RecurrentLM, hook_names  # noqa: E402

RECIPE_FLOAT32 = (hook_names.EMBED, hook_names.E, hook_names.STATE, hook_names.LATENT)

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


def state_dtypes_under_fsdp(
    config: RecurrentConfig, device: torch.device, precision: Precision, tokens: int = 256
) -> dict[str, str]:
    """Activation and norm-weight dtypes of one forward of ``config`` FSDP2-sharded over a one-rank
    mesh on ``device`` (nccl on a GPU, gloo on the CPU), under ``precision``'s autocast."""
    import tempfile

    import torch.distributed as dist

    store = Path(tempfile.mkdtemp(prefix="bench_fsdp_")) / "store"
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    try:
        with torch.device("meta"):
            model = RecurrentLM(config, init_weights=False)
        ctx = DistContext(device=device, backend=backend)
        shard_model(model, flat_mesh(ctx), precision)
        materialise(model, device)
        init_parameters(model, seed=0)
        dtypes: dict[str, str] = {}

        def record(tensor: torch.Tensor, hook) -> None:
            dtypes.setdefault(hook.name, str(tensor.dtype).removeprefix("torch."))

        def record_norms(block: torch.nn.Module, args: tuple) -> None:
            dtypes.setdefault(
                "core.0 norm weights", str(block.norm_1.weight.dtype).removeprefix("torch.")
            )

        handle = model.transformer.core_block[0].register_forward_pre_hook(record_norms)
        ids = torch.randint(
            0, config.vocab_size, (1, min(tokens, config.block_size)), device=device
        )
        names = [
            *RECIPE_FLOAT32,
            hook_names.core(0, "hook_resid_post"),
            hook_names.core(0, "hook_mlp_out"),
        ]
        with torch.no_grad(), model.hooks([(n, record) for n in names]), precision.autocast():
            model(ids, num_steps=2)
        handle.remove()
        return dtypes
    finally:
        dist.destroy_process_group()


def state_is_float32(dtypes: dict[str, str]) -> bool:
    """The recipe: everything but the matmul outputs float32."""
    return all(v == "float32" for k, v in dtypes.items() if not k.endswith("hook_mlp_out"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_train: no GPU visible (CUDA or ROCm); nothing measured", file=sys.stderr)
        return 2
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
    precision = resolve_precision(config.train.precision, "cuda")
    dtypes = state_dtypes_under_fsdp(config.model_config(), torch.device("cuda", 0), precision)
    result["fsdp_state_dtypes"] = dtypes
    result["fsdp_state_float32"] = state_is_float32(dtypes)
    print(
        f"fsdp on one GPU ({precision.name}): "
        + ", ".join(f"{k} {v}" for k, v in dtypes.items())
        + ("; state float32 as in the recipe" if result["fsdp_state_float32"] else "; NOT float32")
    )
    if args.json:
        print(json.dumps(result))
    return 0 if result["fsdp_state_float32"] else 1


if __name__ == "__main__":
    sys.exit(main())
