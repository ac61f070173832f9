"""The training configuration: YAML sections model / data / train / distributed / cluster.

A config file only needs the keys it changes; every other key keeps the default below. ``--set
train.lr=1e-3`` overrides one dotted key (the value is parsed as YAML, so numbers, booleans and lists
work). Unknown keys are an error naming the key, so a typo never silently trains the wrong thing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.config import ClusterSection, ConfigError, read_yaml, section_from_mapping
from pretrain.curriculum import CurriculumError, RecurrenceCurriculum, curriculum_from
from pretrain.data.config import DataConfig
from pretrain.init_from import InitFromError, check_weights, init_from_config
from pretrain.precision import PRECISIONS
from pretrain.strategy import strategy_names
from recurrent_model import RecurrentConfig, preset

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "cpu-small.yaml"


class TrainConfigError(ConfigError):
    """A training configuration that cannot be used; the message names the key."""


@contextlib.contextmanager
def _train_config_errors() -> Iterator[None]:
    """A ConfigError of the shared config reading (cluster/config.py) raised as TrainConfigError."""
    try:
        yield
    except TrainConfigError:
        raise
    except ConfigError as exc:
        raise TrainConfigError(str(exc)) from None


@dataclass
class ModelSection:
    """A model preset plus field overrides; vocab_size and block_size follow the data section.

    ``init_from``: a checkpoint directory to start from (``launch.py --init-from``, e.g. one
    ``python -m pretrain.retrofit`` wrote); the model is then that checkpoint's (its config.json
    and weights), and ``overrides`` may only repeat its values."""

    preset: str = "small"
    overrides: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None


@dataclass
class DataSection(DataConfig):
    """``pretrain.data.DataConfig`` plus where prepared data lives and who prepares it.

    ``prepare_in_job``: the training job builds missing or stale data itself (small local runs); when
    false (cluster configs) it only reads the manifest and fails fast, naming ``pretrain/prepare.py``.
    ``workers``: tokenizer processes of ``pretrain/prepare.py`` (``--workers`` overrides).
    """

    cache_dir: str | None = None  # None: OUT/data
    prepare_in_job: bool = True
    workers: int = 1

    def directory(self, out: str | Path) -> Path:
        """Where the prepared data of a run writing to ``out`` lives."""
        return Path(self.cache_dir) if self.cache_dir else Path(out) / "data"

    def data_config(self) -> DataConfig:
        """The DataConfig part, for ``prepare_data``."""
        names = {f.name for f in dataclasses.fields(DataConfig)}
        return DataConfig(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})


@dataclass
class TrainSection:
    """Optimisation, depth, precision, checkpointing and logging."""

    max_steps: int = 200
    micro_batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 50
    cooldown_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    backprop_depth: int | None = None  # None: the model's mean_backprop_depth
    activation_checkpointing: bool = False
    compile: bool = False
    precision: str = "auto"  # auto: bf16 autocast on GPU, float32 on CPU; or "bf16" / "fp32"
    device: str = "auto"
    threads: int | None = None
    checkpoint_every: int = 100
    keep_last: int = 3
    export_every: int = 1  # Huginn-layout weights every K checkpoints and at the end (0: end only)
    export_dtype: str = "float32"  # or "bfloat16": the exported weights (resume reads the shards)
    profile_steps: int = 0  # > 0: torch.profiler over the first N steps, trace in OUT/profile
    # Non-finite loss or gradient norm: the update is skipped; this many in a row stop the run
    max_skipped_steps: int = 20
    loss_spike_factor: float = 0.0  # > 0: a loss above k x its running median is a spike
    loss_spike_window: int = 100  # steps in the running median
    loss_spike_action: str = "warn"  # or "stop": end the run before the spike's update
    log_every: int = 10
    health_every: int = 50
    val_every: int = 100
    val_batches: int = 4
    val_depths: list[int] | None = None  # None: 1, 4, 8, r̄, 2r̄
    # {shape: linear | 1-sqrt, start, steps, target}: r̄ raised over the first steps
    # (pretrain/curriculum.py); None: r̄ throughout
    recurrence_curriculum: dict[str, Any] | None = None
    progress: bool = True
    tensorboard: bool = True  # scalars also to OUT/tensorboard
    wandb_project: str | None = None  # W&B when wandb is installed (or set WANDB_PROJECT)


@dataclass
class DistributedSection:
    """How ranks share the work: a strategy of pretrain/strategy.py's registry (ddp, bucketed,
    fsdp, hsdp) and its settings."""

    strategy: str = "ddp"
    bucket_mb: float = 64.0
    shard_size: int = 0  # hsdp: ranks per shard group; 0 = the ranks of one node
    # True: checkpoint shards are written by a background thread (dcp.async_save)
    async_checkpoint: bool = False
    timeout_minutes: int = 30  # collective timeout while starting and through the first step
    # The collective timeout from the second step on (every group): a step with its validation and
    # its checkpoint must finish within it (--plan shows the checkpoint's seconds beside it)
    step_timeout_s: float = 600.0
    stop_grace_s: float = 120.0  # after SIGTERM: seconds to reach the agreed stop, else exit 143
    preflight_mb: float = 0.0  # > 0: growing all-reduces up to this size before training


SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "data": DataSection,
    "train": TrainSection,
    "distributed": DistributedSection,
    "cluster": ClusterSection,
}


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        if not isinstance(raw, dict):
            raise TrainConfigError(f"a training config is a mapping, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(SECTIONS))
        if unknown:
            raise TrainConfigError(
                f"unknown config section(s) {', '.join(unknown)}; sections: {', '.join(SECTIONS)}"
            )
        with _train_config_errors():
            sections = {
                name: section_from_mapping(section_cls, name, raw.get(name))
                for name, section_cls in SECTIONS.items()
            }
        config = cls(**sections)
        config.validate()
        return config

    def validate(self) -> None:
        t, d = self.train, self.distributed
        if d.strategy not in strategy_names():
            raise TrainConfigError(
                f"distributed.strategy={d.strategy!r}; choose from {', '.join(strategy_names())}"
            )
        if t.precision not in PRECISIONS:
            raise TrainConfigError(
                f"train.precision={t.precision!r}; choose from {', '.join(PRECISIONS)}"
            )
        for key in ("max_steps", "micro_batch_size", "grad_accum", "checkpoint_every", "log_every"):
            if int(getattr(t, key)) < 1:
                raise TrainConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
        if d.bucket_mb <= 0:
            raise TrainConfigError(f"distributed.bucket_mb must be > 0, got {d.bucket_mb}")
        with _train_config_errors():
            self.cluster.validate()
        if d.timeout_minutes < 1 or d.step_timeout_s <= 0 or d.stop_grace_s <= 0:
            raise TrainConfigError(
                "distributed.timeout_minutes must be >= 1, distributed.step_timeout_s and "
                "distributed.stop_grace_s > 0"
            )
        if d.shard_size < 0:
            raise TrainConfigError(f"distributed.shard_size must be >= 0, got {d.shard_size}")
        if t.keep_last < 1:
            raise TrainConfigError(f"train.keep_last must be >= 1, got {t.keep_last}")
        if t.export_every < 0 or t.profile_steps < 0:
            raise TrainConfigError("train.export_every and train.profile_steps must be >= 0")
        if t.max_skipped_steps < 0 or t.loss_spike_factor < 0 or t.loss_spike_window < 1:
            raise TrainConfigError(
                "train.max_skipped_steps and train.loss_spike_factor must be >= 0, "
                "train.loss_spike_window >= 1"
            )
        if t.loss_spike_action not in ("warn", "stop"):
            raise TrainConfigError(
                f"train.loss_spike_action={t.loss_spike_action!r}; choose from warn, stop"
            )
        if t.export_dtype not in ("float32", "bfloat16"):
            raise TrainConfigError(
                f"train.export_dtype={t.export_dtype!r}; choose from float32, bfloat16"
            )
        if t.lr <= 0:
            raise TrainConfigError(f"train.lr must be > 0, got {t.lr}")
        if t.warmup_steps < 0 or t.cooldown_steps < 0:
            raise TrainConfigError("train.warmup_steps and train.cooldown_steps must be >= 0")
        model = self.model_config()
        if model.block_size < self.data.block_size:
            raise TrainConfigError(
                f"data.block_size={self.data.block_size} exceeds the model's context "
                f"({model.block_size} tokens)"
            )
        if self.model.init_from:
            self._validate_init_from(model)
        try:
            self.curriculum()
        except CurriculumError as exc:
            raise TrainConfigError(str(exc)) from None

    def _validate_init_from(self, model: Any) -> None:
        """--init-from: the data's vocabulary is the model's, and the model's family trains
        everything the train section asks for."""
        if model.vocab_size != self.data.vocab_size:
            raise TrainConfigError(
                f"data.vocab_size={self.data.vocab_size} but the --init-from model "
                f"{self.model.init_from} has vocab_size {model.vocab_size}: set data.vocab_size "
                "(and data.tokenizer_path to the model's tokenizer)"
            )
        try:
            check_weights(self.model.init_from, model)
        except InitFromError as exc:
            raise TrainConfigError(str(exc)) from None
        if not isinstance(model, RecurrentConfig):
            for key in ("activation_checkpointing", "compile"):
                if getattr(self.train, key):
                    raise TrainConfigError(
                        f"train.{key} is offered for Huginn's model only, not for the "
                        f"{type(model).__name__.removesuffix('Config')} model of --init-from"
                    )

    def model_config(self) -> Any:
        """The model's config: the preset, the overrides, the data's vocabulary and block size;
        with ``model.init_from`` the config of that checkpoint (its family's config class)."""
        if self.model.init_from:
            try:
                return init_from_config(self.model.init_from, self.model.overrides)
            except InitFromError as exc:
                raise TrainConfigError(str(exc)) from None
        fields = {
            "vocab_size": self.data.vocab_size,
            "block_size": self.data.block_size,
            **self.model.overrides,
        }
        try:
            return preset(self.model.preset, **fields)
        except TypeError as exc:
            raise TrainConfigError(f"model.overrides: {exc}") from exc

    @property
    def backprop_depth(self) -> int:
        k = self.train.backprop_depth
        return self.model_config().mean_backprop_depth if k is None else int(k)

    def curriculum(self) -> RecurrenceCurriculum | None:
        """``train.recurrence_curriculum`` (its target defaults to the model's r̄), or None."""
        return curriculum_from(
            self.train.recurrence_curriculum, self.model_config().mean_recurrence
        )

    def val_depths(self) -> list[int]:
        if self.train.val_depths is not None:
            return [int(d) for d in self.train.val_depths]
        r = self.model_config().mean_recurrence
        return sorted({1, 4, 8, r, 2 * r})


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` to a raw config mapping (value parsed as YAML)."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise TrainConfigError(f"--set expects key=value, got {assignment!r}")
    parts = key.strip().split(".")
    if len(parts) < 2:
        raise TrainConfigError(f"--set key {key!r} needs a section, e.g. train.lr=1e-3")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TrainConfigError(f"--set {key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(value)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    init_from: str | None = None,
) -> TrainConfig:
    """Read a YAML config (default: cpu-small.yaml) and apply ``--set`` overrides. ``init_from``
    (or a ``model.init_from`` of the file or of ``--set``): the model section is that
    checkpoint's, and a ``--set model.*`` that would change it is refused."""
    with _train_config_errors():
        raw = copy.deepcopy(read_yaml(path if path is not None else DEFAULT_CONFIG))
    if not isinstance(raw, dict):
        raise TrainConfigError(f"a training config is a mapping, got {type(raw).__name__}")
    overrides = list(overrides or [])
    if init_from is not None:
        overrides.append(f"model.init_from={init_from}")
    start = _init_from_setting(raw, overrides)
    if start:
        raw["model"] = {"init_from": start}
    for assignment in overrides:
        apply_override(raw, assignment)
    if start:
        _refuse_model_settings(raw["model"], start)
        tokenizer = Path(start) / "tokenizer.json"
        data = raw.setdefault("data", {}) or {}
        if isinstance(data, dict) and data.get("tokenizer_path") is None and tokenizer.is_file():
            data["tokenizer_path"] = str(Path(start))
            raw["data"] = data
    return TrainConfig.from_dict(raw)


def _init_from_setting(raw: dict[str, Any], overrides: list[str]) -> str | None:
    """The checkpoint a run starts from: the last ``--set model.init_from``, else the file's."""
    for assignment in reversed(overrides):
        key, _, value = assignment.partition("=")
        if key.strip() == "model.init_from":
            chosen = yaml.safe_load(value)
            return None if chosen is None else str(chosen)
    model = raw.get("model")
    chosen = model.get("init_from") if isinstance(model, dict) else None
    return None if chosen is None else str(chosen)


def _refuse_model_settings(model: Any, start: str) -> None:
    """With --init-from only ``model.overrides`` may be set (each checked against the
    checkpoint's config later); a preset names another model."""
    extra = sorted(set(model) - {"init_from", "overrides"}) if isinstance(model, dict) else []
    if extra:
        raise TrainConfigError(
            f"--set model.{extra[0]} conflicts with --init-from {start}: the model is that "
            "checkpoint's (its config.json)"
        )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--set KEY=VALUE`` (repeatable) and ``--out``: the arguments every command that
    reads a training config shares (launch.py, prepare.py)."""
    parser.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="YAML config (default cpu-small)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted config key, e.g. --set train.lr=3e-4 (repeatable)",
    )
    parser.add_argument("--out", default=None, help="run directory (default runs/<config name>)")
    parser.add_argument(
        "--init-from",
        default=None,
        metavar="CHECKPOINT",
        help="start from this checkpoint's weights (fresh optimizer, step 0), e.g. one "
        "python -m pretrain.retrofit wrote; the model section is its config.json",
    )


def run_directory(out: str | None, config_path: str) -> Path:
    """``--out`` when given, else runs/<config file stem>."""
    return Path(out) if out else Path("runs") / Path(config_path).stem
