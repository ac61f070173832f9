"""ROCm detection and the recipe's Frontier (MI250X, Slingshot) environment."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

import torch


def is_rocm() -> bool:
    """True on a ROCm build of torch (torch.version.hip set); the cuda API and device still apply."""
    return getattr(torch.version, "hip", None) is not None


def backend_name() -> str:
    """The collective library behind the "nccl" backend on this build."""
    return "rccl" if is_rocm() else "nccl"


def frontier_environment(
    ofi_rccl_lib: str = "$HOME/aws-ofi-rccl/lib",
    gdr: bool = True,
    cache_root: str = "/tmp",
    omp_threads: int = 7,
) -> dict[str, str]:
    """The environment variables the authors' Frontier launch used (the public training code's launch scripts).

    ``gdr=False`` is the switch that disables GPU-direct RDMA after hangs. Caches point at node-local
    ``cache_root`` to avoid lock contention on the shared file system.
    """
    env = {
        "LD_LIBRARY_PATH": f"{ofi_rccl_lib}:${{LD_LIBRARY_PATH:-}}",
        "NCCL_SOCKET_IFNAME": "hsn",
        # gloo (the checkpoint group, CPU collectives) takes one exact interface, not a prefix
        "GLOO_SOCKET_IFNAME": "hsn0",
        "NCCL_CROSS_NIC": "1",
        "FI_CXI_ATS": "0",
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "MPICH_GPU_SUPPORT_ENABLED": "0",
        "OMP_NUM_THREADS": str(omp_threads),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache_root}/torchinductor-${{USER}}",
        "MIOPEN_USER_DB_PATH": f"{cache_root}/miopen-${{USER}}",
        "MIOPEN_CUSTOM_CACHE_DIR": f"{cache_root}/miopen-${{USER}}",
    }
    if gdr:
        env["NCCL_NET_GDR_LEVEL"] = "3"
    return env


def _expand(value: str, environ: Mapping[str, str]) -> str:
    """Expand $NAME, ${NAME} and ${NAME:-} from ``environ`` (unset names become empty)."""
    return re.sub(
        r"\$\{(\w+)(?::-)?\}|\$(\w+)",
        lambda m: environ.get(m.group(1) or m.group(2), ""),
        value,
    )


def set_frontier_environment(
    environ: MutableMapping[str, str] | None = None, **kwargs: object
) -> dict[str, str]:
    """Apply ``frontier_environment`` to ``environ`` (default os.environ), expanding $VARS; keep
    values the user already set. Returns what was set."""
    environ = os.environ if environ is None else environ
    applied = {}
    for key, value in frontier_environment(**kwargs).items():  # type: ignore[arg-type]
        if key in environ and key != "LD_LIBRARY_PATH":
            continue
        environ[key] = _expand(value, environ).rstrip(":")
        applied[key] = environ[key]
    return applied
