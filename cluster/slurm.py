"""SLURM's side of a task: whether this process runs under SLURM, and the torch rank variables
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) derived from SLURM's."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, MutableMapping

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
