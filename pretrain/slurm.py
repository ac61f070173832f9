"""SLURM: ranks from SLURM's variables, the first host of a node list, and the sbatch script."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, MutableMapping

from .config import TrainConfig
from .rocm import frontier_environment

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


def sbatch_script(config: TrainConfig, config_path: str, overrides: list[str] | None = None) -> str:
    """A complete sbatch script for the configured cluster: one process per GPU/GCD, node-local
    caches, the recipe's environment, a USR1 five minutes before the limit, and an array chain
    (``%1``: one job at a time) whose every link resumes from the newest checkpoint."""
    c = config.cluster
    tasks = c.nodes * c.gpus_per_node
    env = frontier_environment(ofi_rccl_lib=c.ofi_rccl_lib, gdr=c.gdr)
    args = ["--config", config_path, "--out", c.out, "--resume"]
    for o in overrides or []:
        args += ["--set", o]
    array = f"#SBATCH --array=1-{c.array_length}%1\n" if c.array_length > 1 else ""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=huginn-{c.name}",
        f"#SBATCH --account={c.account}",
        f"#SBATCH --partition={c.partition}",
        f"#SBATCH --nodes={c.nodes}",
        f"#SBATCH --ntasks-per-node={c.gpus_per_node}",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
        f"#SBATCH --cpus-per-task={c.cpus_per_task}",
        f"#SBATCH --time={c.time}",
        "#SBATCH --signal=USR1@300",
        "#SBATCH --output=slurm-%x-%A_%a.out",
        *([array.rstrip("\n")] if array else []),
        "set -euo pipefail",
        "",
        f"# {c.nodes} nodes x {c.gpus_per_node} = {tasks} ranks. The array chain runs one link at a",
        "# time (%1); every link resumes from checkpoints/latest (--resume starts fresh if none).",
        "# SLURM sends USR1 to every rank 300 s before the limit: they checkpoint and exit.",
        *(f"module load {m}" for m in c.modules),
        f"source {c.venv}/bin/activate",
        f"mkdir -p {c.out}",
        "",
        "# The recipe's environment (pretrain/rocm.py: frontier_environment)",
        *(f'export {k}="{v}"' for k, v in env.items()),
        "",
        "# Node-local caches, created on every node",
        f"srun -N {c.nodes} --ntasks-per-node=1 mkdir -p "
        '"$TORCHINDUCTOR_CACHE_DIR" "$MIOPEN_USER_DB_PATH"',
        "",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=$((29500 + SLURM_JOB_ID % 20000))",
        "",
        f"srun -N {c.nodes} -n {tasks} --ntasks-per-node={c.gpus_per_node} "
        f"--gpus-per-node={c.gpus_per_node} -c {c.cpus_per_task} --kill-on-bad-exit=1 \\",
        "    python pretrain/launch.py " + " ".join(shlex.quote(a) for a in args),
        "",
    ]
    return "\n".join(lines)
