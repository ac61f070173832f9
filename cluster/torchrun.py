"""Local ranks through torchrun: re-run a script or a module as N ranks on this host
(torch.distributed.run), forwarding SIGTERM and SIGINT to them, and the command line those ranks
get (without ``--nproc``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def relaunch_with_torchrun(
    nproc: int, argv: list[str], *, script: str | Path | None = None, module: str | None = None
) -> int:
    """Re-run as ``nproc`` local ranks through torchrun (torch.distributed.run): ``python SCRIPT``
    or ``python -m MODULE`` (exactly one of them) with ``argv``; returns torchrun's exit code."""
    if (script is None) == (module is None):
        raise ValueError("relaunch_with_torchrun takes a script or a module, not both or neither")
    target = ["-m", module] if module is not None else [os.path.abspath(str(script))]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *target,
        *argv,
    ]
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env and not torch.cuda.is_available():
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    return run_forwarding_signals(cmd, env)


def run_forwarding_signals(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` (torchrun) and wait for it; SIGTERM and SIGINT sent to this launcher are passed
    on to it (torchrun passes them to its ranks, which checkpoint and stop), so no rank outlives
    the launcher. Off the main thread the signals keep their handlers."""
    child = subprocess.Popen(cmd, env=env)

    def forward(signum: int, frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {}
    for sig in FORWARDED_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread
            break
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def strip_nproc(argv: list[str]) -> list[str]:
    """argv without --nproc (and its value), for the ranks torchrun starts."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        if arg.startswith("--nproc="):
            continue
        out.append(arg)
    return out
