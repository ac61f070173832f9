"""The cluster section of a config file (what a job script asks SLURM for and sets up on the
nodes), and the reading of config files: YAML, one dataclass per section, unknown keys refused by
name, numbers written as text (``1e-3``) turned into the field's type."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

WANDB_MODES = ("offline", "online", "disabled")
Section = TypeVar("Section")


class ConfigError(ValueError):
    """A config file or section that cannot be used; the message names the file or the key."""


@dataclass
class ClusterSection:
    """What a job script (``--slurm-script``) asks for and sets up on the nodes."""

    name: str = "frontier"
    nodes: int = 1
    gpus_per_node: int = 8
    device: str = "mi250x"  # for the memory plan (--plan): mi250x, mi300x, h100, h200
    cpus_per_task: int = 7
    time: str = "02:00:00"
    account: str = "CHANGE_ME"
    partition: str = "batch"
    array_length: int = 1
    modules: list[str] = field(
        default_factory=lambda: ["PrgEnv-gnu", "rocm", "craype-accel-amd-gfx90a"]
    )
    ofi_rccl_lib: str = "$HOME/aws-ofi-rccl/lib"
    venv: str = ".venv"
    out: str = "runs/frontier"
    gdr: bool = True
    # True: request node-local NVMe (sbatch -C nvme) and stage the venv and caches there
    nvme: bool = False
    node_local_dir: str = ""  # "": /mnt/bb/$USER with nvme, else /tmp
    wandb_mode: str = "offline"  # WANDB_MODE on the compute nodes unless the job's env sets it

    def validate(self) -> None:
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError(
                f"cluster.wandb_mode={self.wandb_mode!r}; choose from {', '.join(WANDB_MODES)}"
            )


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds (empty for an empty file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc


def section_from_mapping(section_cls: type[Section], name: str, values: Any) -> Section:
    """The dataclass ``section_cls`` from the mapping of config section ``name`` (None: defaults)."""
    values = values or {}
    if not isinstance(values, dict):
        raise ConfigError(f"config section {name!r} must be a mapping")
    known = {f.name for f in dataclasses.fields(section_cls)}  # type: ignore[arg-type]
    bad = sorted(set(values) - known)
    if bad:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{name}.{k}' for k in bad)}; "
            f"{name} takes {', '.join(sorted(known))}"
        )
    return section_cls(**coerce_numbers(section_cls, name, values))


def coerce_numbers(section_cls: type, section: str, values: dict[str, Any]) -> dict[str, Any]:
    """Turn YAML strings like ``1e-3`` (YAML 1.1 reads them as text) into the field's number type."""
    defaults = {f.name: f.default for f in dataclasses.fields(section_cls)}
    out = dict(values)
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(default, bool) or isinstance(value, bool) or value is None:
            continue
        if isinstance(default, (int, float)) and isinstance(value, (str, int, float)):
            kind = float if isinstance(default, float) else int
            try:
                number = float(value)
                if kind is int and not number.is_integer():
                    raise ValueError
                out[key] = kind(number)
            except ValueError:
                raise ConfigError(f"{section}.{key}={value!r} is not a {kind.__name__}") from None
    return out


def load_cluster(path: str | Path) -> ClusterSection:
    """The validated cluster section of the YAML config file ``path`` (its other sections are not
    read)."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} holds {type(raw).__name__}, not a mapping of sections")
    cluster = section_from_mapping(ClusterSection, "cluster", raw.get("cluster"))
    cluster.validate()
    return cluster
