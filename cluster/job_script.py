"""The generic pieces of an sbatch script for a cluster section: the preamble (SBATCH lines,
open-file limit, modules, the recipe's environment with node-local caches, the venv staged on
node-local storage) and the main step on every rank (then the caches kept for the next link and the
node-local copies removed). A job's own steps go between the two."""

from __future__ import annotations

import shlex
from pathlib import Path

from .config import ClusterSection
from .rocm import frontier_environment

NVME_ROOT = "/mnt/bb/${USER}"  # Frontier's node-local NVMe, mounted when the job asks -C nvme

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


def node_local_root(cluster: ClusterSection) -> str:
    """Where each node keeps the venv and caches: ``cluster.node_local_dir``, else the NVMe when
    ``cluster.nvme``, else /tmp."""
    return (cluster.node_local_dir or (NVME_ROOT if cluster.nvme else "/tmp")).rstrip("/")


def _venv_staging(cluster: ClusterSection) -> list[str]:
    """Script lines that put the venv on node-local storage and activate it there: tar it once per
    chain (again when it changed), sbcast the tarball to every node, untar there in a
    one-task-per-node step; the caches are seeded from the chain's persistent copy in the same step."""
    venv = cluster.venv.rstrip("/") or "."
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
        f"srun -N {cluster.nodes} --ntasks-per-node=1 bash -c node_setup",
        f'export VIRTUAL_ENV="$NODE_TMP/{venv_name}"',
        'export PATH="$VIRTUAL_ENV/bin:$PATH"',
        "",
    ]


def job_preamble(
    cluster: ClusterSection, job_name: str, array_length: int, out: str, about: list[str]
) -> list[str]:
    """The first part of every job script of the cluster: SBATCH lines (an ``array_length`` chain
    of one link at a time when > 1), open-file limit, modules, the recipe's environment with
    node-local caches, and the venv staged on node-local storage. ``about`` is comment lines."""
    c = cluster
    tasks = c.nodes * c.gpus_per_node
    node_tmp = f"{node_local_root(c)}/huginn-${{SLURM_JOB_ID}}"  # node-local, per job
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
        "# The recipe's environment (cluster/rocm.py: frontier_environment); caches node-local",
        *(f'export {k}="{v}"' for k, v in env.items()),
        "",
        *_venv_staging(c),
    ]
    return lines


def rank_step(cluster: ClusterSection, command: str) -> list[str]:
    """The job's main step: ``command`` on every rank (one per GPU/GCD), then the caches saved for
    the next link and the node-local copies removed; the script exits with the step's status."""
    c = cluster
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
