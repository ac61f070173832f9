"""NCCL's flight recorder (RCCL's on ROCm): the variables that make each rank keep its last
collectives and dump them on a collective timeout to ``OUT/stacks/nccl_trace_rank_<k>``, set in
this process before the process group exists or exported by a job script."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

STACKS_DIR = "stacks"  # under a run's OUT: the flight recorder's dumps and the ranks' stack dumps
FLIGHT_RECORDER_ENTRIES = "2000"  # the last collectives kept per rank
TRACE_FILE_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_env(out: str | Path) -> dict[str, str]:
    """The variables that make ProcessGroupNCCL (RCCL on ROCm) keep its last collectives and dump
    them on a timeout to ``OUT/stacks/nccl_trace_rank_<k>`` (both names torch has read)."""
    prefix = str(Path(out).resolve() / STACKS_DIR / "nccl_trace_rank_")
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": FLIGHT_RECORDER_ENTRIES,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ENABLE_MONITORING": "1",  # the dump on a timeout needs it (torch's default)
        **dict.fromkeys(TRACE_FILE_VARIABLES, prefix),
    }


def enable_flight_recorder(out: str | Path, environ: Any = os.environ) -> None:
    """Set the flight recorder's variables unless the user set them; before the group exists."""
    (Path(out) / STACKS_DIR).mkdir(parents=True, exist_ok=True)
    for key, value in flight_recorder_env(out).items():
        environ.setdefault(key, value)


def flight_recorder_lines(out: str) -> list[str]:
    """Job-script lines for the flight recorder: each rank keeps its last collectives and dumps
    them on a collective timeout to OUT/stacks/nccl_trace_rank_<k>, beside the ranks' Python stack
    dumps."""
    stacks = f"$(realpath -m {shlex.quote(out)})/{STACKS_DIR}"
    env = flight_recorder_env("OUT")
    return [
        "# RCCL's flight recorder: each rank's last collectives, dumped on a collective timeout",
        "# beside the ranks' Python stack dumps (OUT/stacks).",
        f'mkdir -p "{stacks}"',
        *(
            f'export {key}="{stacks}/nccl_trace_rank_"'
            if key in TRACE_FILE_VARIABLES
            else f"export {key}={value}"
            for key, value in env.items()
        ),
        "",
    ]
