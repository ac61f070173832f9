"""SLURM: ranks from SLURM's variables, the first host of a node list, and the sbatch script
(ulimit, venv broadcast with sbcast, persistent caches, data preparation as its own step)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from .config import TrainConfig
from .rocm import frontier_environment
from .watchdog import flight_recorder_env

DEFAULT_PORT = 29500


def under_slurm(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return "SLURM_PROCID" in environ


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "frontier[00012-00015,00020],login1" -> "frontier00012".

    Uses ``scontrol show hostnames`` when available, else parses the compact syntax.
    """
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return parse_first_host(nodelist)


def parse_first_host(nodelist: str) -> str:
    """Parse the first host of a compact node list without scontrol."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("empty SLURM node list")
    match = re.match(r"([^,\[]*)(\[([^\]]*)\])?", nodelist)
    if match is None:  # pragma: no cover - the pattern matches every string
        raise ValueError(f"cannot parse SLURM node list {nodelist!r}")
    prefix, bracket = match.group(1), match.group(3)
    if bracket is None:
        return prefix
    first = bracket.split(",")[0].split("-")[0]
    return prefix + first


def slurm_port(environ: Mapping[str, str]) -> int:
    """A port derived from the job id, so chained jobs on shared nodes do not collide."""
    job = environ.get("SLURM_JOB_ID", "")
    return DEFAULT_PORT + (int(job) % 20000 if job.isdigit() else 0)


def set_torch_env_from_slurm(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from SLURM_* (keeps values already set)."""
    environ = os.environ if environ is None else environ
    values = {
        "RANK": environ["SLURM_PROCID"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "WORLD_SIZE": environ.get("SLURM_NTASKS", "1"),
        "MASTER_PORT": str(slurm_port(environ)),
    }
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    values["MASTER_ADDR"] = first_host(nodelist) if nodelist else "127.0.0.1"
    for key, value in values.items():
        environ.setdefault(key, value)
    return {k: environ[k] for k in values}


NVME_ROOT = "/mnt/bb/${USER}"  # Frontier's node-local NVMe, mounted when the job asks -C nvme


def node_local_root(config: TrainConfig) -> str:
    """Where each node keeps the venv and caches: ``cluster.node_local_dir``, else the NVMe when
    ``cluster.nvme``, else /tmp."""
    c = config.cluster
    return (c.node_local_dir or (NVME_ROOT if c.nvme else "/tmp")).rstrip("/")


# Runs once on every node (one task per node): unpack the broadcast venv, seed the node-local
# caches from the chain's persistent copy. Exported as a bash function so srun's bash can call it.
NODE_SETUP = r"""node_setup() {
    set -euo pipefail
    mkdir -p "$NODE_TMP" "$TORCHINDUCTOR_CACHE_DIR" "$MIOPEN_USER_DB_PATH"
    tar -C "$NODE_TMP" -xf "$NODE_TMP.venv.tar"
    rm -f "$NODE_TMP.venv.tar"
    cp -a "$RUN_CACHE/inductor/." "$TORCHINDUCTOR_CACHE_DIR/" 2>/dev/null || true
    cp -a "$RUN_CACHE/miopen/." "$MIOPEN_USER_DB_PATH/" 2>/dev/null || true
}"""


def _quoted(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _venv_staging(config: TrainConfig) -> list[str]:
    """Script lines that put the venv on node-local storage and activate it there: tar it once per
    chain (again when it changed), sbcast the tarball to every node, untar there in a
    one-task-per-node step; the caches are seeded from the chain's persistent copy in the same step."""
    c = config.cluster
    venv = c.venv.rstrip("/") or "."
    venv_name = shlex.quote(Path(venv).name)
    return [
        "# The venv to node-local storage: tar it once per chain (again when it changed), sbcast the",
        "# tarball to every node, untar there in a one-task-per-node step; the caches are seeded",
        "# from the chain's persistent copy in the same step.",
        f"VENV={shlex.quote(venv)}",
        'VENV_TAR="$RUN_CACHE/venv.tar"',
        'if [ ! -f "$VENV_TAR" ] || [ -n "$(find "$VENV/" -newer "$VENV_TAR" -print -quit)" ]; then',
        '    tar -C "$(dirname "$VENV")" -cf "$VENV_TAR.tmp" "$(basename "$VENV")"',
        '    mv "$VENV_TAR.tmp" "$VENV_TAR"',
        "fi",
        'sbcast --force --compress "$VENV_TAR" "$NODE_TMP.venv.tar"',
        NODE_SETUP,
        "export -f node_setup",
        f"srun -N {c.nodes} --ntasks-per-node=1 bash -c node_setup",
        f'export VIRTUAL_ENV="$NODE_TMP/{venv_name}"',
        'export PATH="$VIRTUAL_ENV/bin:$PATH"',
        "",
    ]


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
            *job_preamble(config, f"huginn-{c.name}", c.array_length, c.out, about),
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
            *rank_step(config, f"python pretrain/launch.py {_quoted([*common, '--resume'])}"),
        ]
    )


def flight_recorder_lines(out: str) -> list[str]:
    """Script lines for RCCL's (NCCL's) flight recorder: each rank keeps its last collectives and
    dumps them on a collective timeout to OUT/stacks/nccl_trace_rank_<k>, beside the Python stack
    dumps (pretrain/watchdog.py)."""
    stacks = f"$(realpath -m {shlex.quote(out)})/stacks"
    env = flight_recorder_env("OUT")
    prefix = "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    return [
        "# RCCL's flight recorder: each rank's last collectives, dumped on a collective timeout",
        "# beside the ranks' Python stack dumps (OUT/stacks).",
        f'mkdir -p "{stacks}"',
        *(
            f'export {key}="{stacks}/nccl_trace_rank_"'
            if key in prefix
            else f"export {key}={value}"
            for key, value in env.items()
        ),
        "",
    ]


def job_preamble(
    config: TrainConfig, job_name: str, array_length: int, out: str, about: list[str]
) -> list[str]:
    """The first part of every job script of the cluster: SBATCH lines (an ``array_length`` chain
    of one link at a time when > 1), open-file limit, modules, the recipe's environment with
    node-local caches, and the venv staged on node-local storage. ``about`` is comment lines."""
    c = config.cluster
    tasks = c.nodes * c.gpus_per_node
    node_tmp = f"{node_local_root(config)}/huginn-${{SLURM_JOB_ID}}"  # node-local, per job
    env = frontier_environment(ofi_rccl_lib=c.ofi_rccl_lib, gdr=c.gdr, cache_root=node_tmp)
    array = f"#SBATCH --array=1-{array_length}%1\n" if array_length > 1 else ""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --account={c.account}",
        f"#SBATCH --partition={c.partition}",
        f"#SBATCH --nodes={c.nodes}",
        f"#SBATCH --ntasks-per-node={c.gpus_per_node}",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
        f"#SBATCH --cpus-per-task={c.cpus_per_task}",
        f"#SBATCH --time={c.time}",
        "#SBATCH --signal=USR1@300",
        "#SBATCH --output=slurm-%x-%A_%a.out",
        *(["#SBATCH -C nvme"] if c.nvme else []),
        *([array.rstrip("\n")] if array else []),
        "set -euo pipefail",
        "",
        f"# {c.nodes} nodes x {c.gpus_per_node} = {tasks} ranks.",
        *about,
        'cd "${SLURM_SUBMIT_DIR:-.}"',
        "",
        "# Each rank memory-maps only the shards it reads, a few at a time; the open-file limit is",
        "# raised to the hard limit anyway (srun --propagate=NOFILE carries it to every node).",
        'ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 1048576 2>/dev/null \\',
        '    || echo "warning: ulimit -n stays at $(ulimit -n)" >&2',
        "set +u  # module scripts may read unset variables",
        *(f"module load {m}" for m in c.modules),
        "set -u",
        f"export NODE_TMP={node_tmp}",
        f'export RUN_CACHE="$(realpath -m {shlex.quote(out)})/cache"  # kept across the chain\'s links',
        'mkdir -p "$RUN_CACHE/inductor" "$RUN_CACHE/miopen"',
        "export PYTHONUNBUFFERED=1",
        "# Compute nodes have no route out: W&B logs offline (wandb sync later) unless told otherwise.",
        f'export WANDB_MODE="${{WANDB_MODE:-{c.wandb_mode}}}"',
        "",
        "# The recipe's environment (pretrain/rocm.py: frontier_environment); caches node-local",
        *(f'export {k}="{v}"' for k, v in env.items()),
        "",
        *_venv_staging(config),
    ]
    return lines


def rank_step(config: TrainConfig, command: str) -> list[str]:
    """The job's main step: ``command`` on every rank (one per GPU/GCD), then the caches saved for
    the next link and the node-local copies removed; the script exits with the step's status."""
    c = config.cluster
    tasks = c.nodes * c.gpus_per_node
    return [
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=$((29500 + SLURM_JOB_ID % 20000))",
        "",
        "status=0",
        "# One GCD per rank, bound to the CPU cores closest to it (OLCF's Frontier guide).",
        f"srun -N {c.nodes} -n {tasks} --ntasks-per-node={c.gpus_per_node} "
        f"-c {c.cpus_per_task} --gpus-per-task=1 --gpu-bind=closest --kill-on-bad-exit=1 "
        "--propagate=NOFILE \\",
        f"    {command} || status=$?",
        "",
        "# Save this node's compile and MIOpen caches for the next link (all nodes compile the same).",
        'cp -a -u "$TORCHINDUCTOR_CACHE_DIR/." "$RUN_CACHE/inductor/" 2>/dev/null || true',
        'cp -a -u "$MIOPEN_USER_DB_PATH/." "$RUN_CACHE/miopen/" 2>/dev/null || true',
        "# Free the node-local copies (the venv is gigabytes; /tmp may be memory).",
        f'srun -N {c.nodes} --ntasks-per-node=1 rm -rf "$NODE_TMP" || true',
        'exit "$status"',
        "",
    ]
