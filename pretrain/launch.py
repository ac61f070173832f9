"""Pretrain a recurrent-depth model: ``python pretrain/launch.py [--config FILE] [--set k=v ...]
[--out DIR] [--init-from CHECKPOINT] [--resume] [--max-steps N] [--nproc N] [--callback
MODULE:NAME] [--slurm-script] [--plan]``.

With no arguments it trains pretrain/configs/cpu-small.yaml on the embedded starter corpus into
runs/cpu-small. ``--nproc N`` re-launches as N local ranks through torchrun; under SLURM
(SLURM_PROCID set) the ranks come from SLURM's variables; ``--slurm-script`` prints the sbatch script;
``--plan`` prints the per-device memory plan (pretrain/plan.py) and exits 0 when the step fits.
``--init-from`` starts from a converted checkpoint's weights (pretrain/init_from.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pretrain.config import (  # noqa: E402
    TrainConfigError,
    add_config_arguments,
    load_config,
    run_directory,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pretrain/launch.py", description=__doc__.split("\n\n")[0])
    add_config_arguments(p)
    add_resume_arguments(p)
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this step (the lr schedule keeps train.max_steps)",
    )
    p.add_argument("--nproc", type=int, default=None, help="run N local ranks through torchrun")
    p.add_argument(
        "--callback",
        dest="callbacks",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="every rank calls NAME() from MODULE and hands the result to the trainer as a "
        "callback (pretrain/callbacks.py; repeatable)",
    )
    p.add_argument(
        "--slurm-script",
        action="store_true",
        help="print the sbatch script for the configured cluster and exit",
    )
    plan = p.add_argument_group("memory plan (--plan)")
    plan.add_argument(
        "--plan",
        action="store_true",
        help="print the per-device memory plan and exit (0: it fits, 3: it does not)",
    )
    plan.add_argument("--nodes", type=int, default=None, help="nodes (default cluster.nodes)")
    plan.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="ranks per node (default cluster.gpus_per_node)",
    )
    plan.add_argument(
        "--device",
        dest="plan_device",
        default=None,
        help="mi250x, mi300x, h100, h200 or cpu (default cluster.device; cpu for train.device=cpu)",
    )
    plan.add_argument(
        "--device-memory", type=float, default=None, metavar="GIB", help="override the capacity"
    )
    plan.add_argument(
        "--fs-bandwidth",
        type=float,
        default=None,
        metavar="GB/S",
        help="file-system write bandwidth for the checkpoint seconds (default 100, an assumption)",
    )
    return p.parse_args(argv)


def add_resume_arguments(p: argparse.ArgumentParser) -> None:
    """``--resume`` and what a resume may take over: changed data, missing optimizer state."""
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints/latest")
    p.add_argument(
        "--allow-data-change",
        action="store_true",
        help="--resume over a changed corpus or tokenizer (the new data is read from its start)",
    )
    p.add_argument(
        "--reset-optimizer",
        action="store_true",
        help="--resume a checkpoint without reading its optimizer state (it starts fresh)",
    )


ALLOCATOR_SETTING = "expandable_segments:True"
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def configure_allocator(env: dict[str, str] | os._Environ = os.environ) -> None:
    """Expandable segments for the CUDA / HIP caching allocator (less fragmentation as the sampled
    depth changes the activations' sizes), unless the user set either variable. Read when CUDA
    initialises, so this runs before any GPU work; torchrun's ranks inherit it."""
    if not any(name in env for name in ALLOCATOR_VARIABLES):
        for name in ALLOCATOR_VARIABLES:
            env[name] = ALLOCATOR_SETTING


def main(argv: list[str] | None = None) -> int:
    configure_allocator()
    raw_argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(raw_argv)
    relaunch = not (args.slurm_script or args.plan)
    if relaunch and not may_start(run_directory(args.out, args.config), args.resume):
        return 2
    if args.nproc and args.nproc > 1 and "RANK" not in os.environ and relaunch:
        from cluster.torchrun import relaunch_with_torchrun, strip_nproc

        # torchrun's ranks read the config themselves
        return relaunch_with_torchrun(args.nproc, strip_nproc(raw_argv), script=__file__)
    try:
        config = load_config(args.config, args.overrides, args.init_from)
    except TrainConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plan:
        return print_plan(config, args)
    if args.slurm_script:
        from pretrain.sbatch import sbatch_script

        settings = args.overrides + (
            [f"model.init_from={args.init_from}"] if args.init_from else []
        )
        print(sbatch_script(config, args.config, settings), end="")
        return 0
    out = run_directory(args.out, args.config)
    from pretrain.callbacks import CallbackError, load_callback

    try:
        callbacks = [load_callback(spec) for spec in args.callbacks]
    except CallbackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return train(
        config,
        out,
        resume=args.resume,
        max_steps=args.max_steps,
        callbacks=callbacks,
        allow_data_change=args.allow_data_change,
        reset_optimizer=args.reset_optimizer,
    )


def may_start(out: Path, resume: bool) -> bool:
    """False (and one line) when a launch without --resume would restart a run in ``out``, or
    when another run holds ``out``."""
    from pretrain.run_lock import RunLockedError, check_unlocked
    from pretrain.trainer import RunDirectoryError, refuse_existing_run

    try:
        check_unlocked(out)
        refuse_existing_run(out, resume)
    except (RunDirectoryError, RunLockedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return False
    return True


def print_plan(config, args: argparse.Namespace) -> int:
    """Print the memory plan; 0 when the step fits on the device, 3 (and one line) when not."""
    from dataclasses import replace

    from pretrain.plan import (
        PlanError,
        format_plan,
        plan_all,
        plan_precision,
        resolve_device,
        verdict,
    )
    from pretrain.plan_compute import compute_plan, format_compute
    from pretrain.plan_host import format_host_plan, host_plan_for

    on_cpu = config.train.device == "cpu"
    nodes = args.nodes or (1 if on_cpu else config.cluster.nodes)
    gpus = args.gpus_per_node or ((args.nproc or 1) if on_cpu else config.cluster.gpus_per_node)
    try:
        device = resolve_device(
            args.plan_device or ("cpu" if on_cpu else config.cluster.device), args.device_memory
        )
        if not device.accelerator and gpus > 1:  # local ranks share the host's memory
            device = replace(device, memory_gib=device.memory_gib / gpus, label=f"host / {gpus}")
        plans = plan_all(config, device, nodes, gpus)
        host = host_plan_for(config, plans[config.distributed.strategy], args.fs_bandwidth)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    plan = plans[config.distributed.strategy]
    print(format_plan(plan, plans))
    print(format_host_plan(host))
    compute = compute_plan(config, nodes * gpus, device.name, plan_precision(config, device).bf16)
    print(format_compute(compute, device.label))
    line = verdict(plan, plans)
    if plan.fits:
        print(line)
        return 0
    print(line, file=sys.stderr)
    return 3


def train(
    config,
    out: Path,
    resume: bool = False,
    max_steps: int | None = None,
    callbacks: Sequence[Any] = (),
    **options: bool,
) -> int:
    """Train in this process (one rank) with ``callbacks``; returns an exit code. ``options``:
    the Trainer's ``allow_data_change`` and ``reset_optimizer``. Torch's thread count is the
    caller's again afterwards."""
    from cluster.context import init_distributed, shutdown
    from pretrain.metrics import json_safe
    from pretrain.run_lock import RunLockedError, hold_run_directory
    from recurrent_model.threads import kept_threads

    ctx = init_distributed(config.train.device, config.distributed.timeout_minutes, out)
    try:
        # train.threads is the trainer's; a caller in this process keeps its own count
        with hold_run_directory(out, ctx), kept_threads():
            code, summary = run_trainer(config, out, ctx, resume, max_steps, callbacks, **options)
    except RunLockedError as exc:
        if ctx.is_main:
            print(f"error: {exc}", file=sys.stderr)
        code, summary = 2, {}
    finally:
        # DDP's reducer holds the process group, and its destructor keeps the GIL while gloo's
        # workers may still need it to free their last tensors: a hang at exit. The trainer goes
        # first, so the group is destroyed by destroy_process_group, which lets go of the GIL.
        gc.collect()
        shutdown()
    if code or summary.get("nothing_to_train"):
        return code
    if ctx.is_main:
        last = summary.pop("last", {})
        summary["loss"] = last.get("loss")
        summary.update({k: v for k, v in last.items() if k.startswith("val_loss_")})
        print(json.dumps(json_safe(summary), allow_nan=False))
    return 0


def run_trainer(
    config,
    out: Path,
    ctx,
    resume: bool,
    max_steps: int | None,
    callbacks: Sequence[Any] = (),
    **options: bool,
) -> tuple[int, dict[str, Any]]:
    """(exit code, summary) of one rank's training; nothing of the trainer outlives the call, even
    when it raises (the traceback's frames are cleared), so ``train`` can destroy the group."""
    from pretrain.checkpoint_manager import CheckpointWriteError
    from pretrain.checkpointing import MetricsFileError, ResumeError
    from pretrain.data import DataError
    from pretrain.loss_guard import TrainingStopped
    from pretrain.startup_checks import StartupError
    from pretrain.trainer import RunDirectoryError, Trainer, TrainingError
    from pretrain.watchdog import CollectiveFailure

    try:
        trainer = Trainer(
            config, out, ctx, resume=resume, max_steps=max_steps, callbacks=callbacks, **options
        )
    except CollectiveFailure as exc:  # this rank's own: every rank says where it waited
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1, {}
    except (DataError, RunDirectoryError, StartupError) as exc:  # one line, not per rank
        print(f"error: {exc}", file=sys.stderr)
        return 2, {}
    except (ResumeError, TrainingError) as exc:  # agreed by every rank; rank 0 says why
        if ctx.is_main:
            print(f"error: {exc}", file=sys.stderr)
        return 2, {}
    stops = (CheckpointWriteError, TrainingStopped, TrainingError, MetricsFileError)
    try:
        return 0, trainer.run()
    except CollectiveFailure as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1, {}
    except stops as exc:  # every rank stops; rank 0 says why
        if ctx.is_main:
            print(f"error: {exc}", file=sys.stderr)
        return 1, {}
    except BaseException as exc:
        del trainer
        traceback.clear_frames(exc.__traceback__)
        raise


if __name__ == "__main__":
    sys.exit(main())
