"""The training job's sbatch script: the cluster's preamble (cluster/job_script.py), the data
preparation as its own step, NCCL's flight recorder, and the trainer on every rank, chained over an
array of links that each resume from the newest checkpoint."""

from __future__ import annotations

import shlex

from cluster.flight_recorder import flight_recorder_lines
from cluster.job_script import job_preamble, rank_step

from .config import TrainConfig


def _quoted(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def sbatch_script(config: TrainConfig, config_path: str, overrides: list[str] | None = None) -> str:
    """A complete sbatch script for the configured cluster: one process per GPU/GCD, a USR1 five
    minutes before the limit, and an array chain (``%1``: one job at a time) whose every link
    resumes from the newest checkpoint.

    Every link raises ``ulimit -n``, copies the venv to node-local storage (``/tmp``, or the NVMe
    with ``cluster.nvme``) once per node (tar once per chain, ``sbcast``, untar in a one-task-per-node
    step) instead of 8 x nodes ranks importing torch from the shared file system, keeps the
    inductor and MIOpen caches node-local while running and persistent in ``OUT/cache`` between
    links, and runs the data preparation as its own step only when the manifest is missing or
    stale. Progress is logged as lines (stdout is a file under SLURM).
    """
    c = config.cluster
    node_cores = c.gpus_per_node * c.cpus_per_task
    workers = config.data.workers if config.data.workers > 1 else node_cores
    common = ["--config", config_path, "--out", c.out]
    for o in overrides or []:
        common += ["--set", o]
    about = [
        "# The array chain runs one link at a time (%1); every link resumes from",
        "# checkpoints/latest (--resume starts fresh if none).",
        "# SLURM sends USR1 to every rank 300 s before the limit: they checkpoint and exit.",
        "# stdout is a file here, so the trainer logs progress lines instead of drawing a bar.",
    ]
    return "\n".join(
        [
            *job_preamble(c, f"huginn-{c.name}", c.array_length, c.out, about),
            "# The data, prepared once as its own step (one node, all its cores), only when the",
            "# manifest is missing or stale. A corpus that takes hours is better prepared by its own",
            f"# job first: sbatch -N 1 -c {node_cores} --wrap 'python pretrain/prepare.py ...', then this",
            "# script with --dependency=afterok:<that job id>. The ranks only read the manifest.",
            f"if ! python pretrain/prepare.py {_quoted(common)} --check; then",
            f"    srun -N 1 -n 1 -c {node_cores} --kill-on-bad-exit=1 \\",
            f"        python pretrain/prepare.py {_quoted(common)} --workers {workers}",
            "fi",
            "",
            *flight_recorder_lines(c.out),
            *rank_step(c, f"python pretrain/launch.py {_quoted([*common, '--resume'])}"),
        ]
    )
