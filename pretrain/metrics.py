"""Training telemetry: FLOPs and MFU, memory, recurrence health, and the metrics sinks (metrics.jsonl,
TensorBoard, W&B)."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from recurrent_model import Depth, RecurrentConfig, diagnostics, speed

# Dense bf16 peak FLOP/s per device (one GCD for MI250X), by a substring of the device name.
PEAK_FLOPS_BF16: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "MI300X": 1307e12,
    "MI250X": 191.5e12,
    "MI250": 181e12,
    "MI210": 181e12,
    "V100": 125e12,
}


def flops_per_token(config: RecurrentConfig, depth: Depth, seq_len: int) -> float:
    """Model FLOPs of one training token at the sampled depth (no recompute counted): the forward
    at ``depth.total`` iterations and twice the forward of the parts that carry gradient
    (``RecurrentConfig.cost.train_flops_per_token``, causal attention)."""
    return config.cost.train_flops_per_token(seq_len, depth.total, depth.grad)


def measure_cpu_matmul_flops(
    size: int = 1024, seconds: float = 0.5, dtype: torch.dtype = torch.float32
) -> float:
    """The CPU's ``F.linear`` throughput on ``size`` rows of a size × size weight in ``dtype``
    with torch's current thread count (FLOP/s, recurrent_model.speed.measure)."""
    weight = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(dtype)
    return speed.measure([weight], size, budget_s=seconds).flops_per_second


def peak_flops(
    device: torch.device, precision_bf16: bool, config: RecurrentConfig, rows: int
) -> tuple[float, str]:
    """(peak FLOP/s per device, where it came from): PRETRAIN_PEAK_FLOPS when set, else the
    datasheet's dense peak of a known GPU, else (the CPU, an unknown GPU) the one F.linear probe
    (``recurrent_model.speed.linear_speed``) at the model's block shapes on ``rows`` token states
    of the step's dtype."""
    if os.environ.get("PRETRAIN_PEAK_FLOPS"):
        return float(os.environ["PRETRAIN_PEAK_FLOPS"]), "PRETRAIN_PEAK_FLOPS"
    unknown = ""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key in sorted(PEAK_FLOPS_BF16, key=len, reverse=True):
            if key in name:
                peak = PEAK_FLOPS_BF16[key]
                return (peak if precision_bf16 else peak / 2), f"table:{key}"
        unknown = f"{name!r} has no datasheet peak (set PRETRAIN_PEAK_FLOPS): "
    dtype = torch.bfloat16 if precision_bf16 else torch.float32
    measured = speed.linear_speed(config=config, device=str(device), dtype=dtype, rows=rows)
    return measured.flops_per_second, f"{unknown}measured, model shapes: {measured.describe()}"


def memory_stats(device: torch.device) -> dict[str, float]:
    """Peak memory in GiB: the accelerator's allocator peak, or the process's max RSS on the CPU."""
    if device.type == "cuda":
        return {"mem_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return {"rss_gib": rss * scale / 2**30}


# Recurrence health ------------------------------------------------------------------------------
def token_correlation(states: torch.Tensor) -> float:
    """Token correlation (recurrent_model.diagnostics) of (B, T, h) states averaged over the batch;
    NaN for a single token."""
    if states.shape[-2] < 2:
        return float("nan")
    return float(diagnostics.token_correlation(states).mean())


def recurrence_health(
    states: torch.Tensor, e: torch.Tensor | None, latents: torch.Tensor, outputs: torch.Tensor
) -> dict[str, float]:
    """Telemetry of one forward: states (r+1, B, T, h) from core.hook_state, e, ln_f(s_r), coda out."""
    s_r = states[-1].float()
    norm_r = s_r.norm(dim=-1)
    out = {
        "health/token_corr_latent": token_correlation(latents),
        "health/token_corr_output": token_correlation(outputs),
        "health/state_norm": float(norm_r.mean()),
    }
    if states.shape[0] >= 2:
        step = (s_r - states[-2].float()).norm(dim=-1)
        out["health/step_abs"] = float(step.mean())
        out["health/step_rel"] = float((step / norm_r.clamp_min(1e-12)).mean())
    if e is not None:
        out["health/dist_to_e"] = float((s_r - e.float()).norm(dim=-1).mean())
    return out


# Metrics sinks: metrics.jsonl, TensorBoard, W&B ----------------------------------------------------
class JsonlSink:
    """Appends one JSON object per logged step to ``metrics.jsonl``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Scalars to a TensorBoard event file (torch.utils.tensorboard), one point per key and step.

    ``purge_step``: on resume, TensorBoard hides the points a killed run wrote at or after it, as
    the trainer rewinds metrics.jsonl.
    """

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in scalars(record).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Scalars to Weights & Biases. The run id follows the run directory, so every link of a SLURM
    chain continues the same W&B run; WANDB_MODE / WANDB_API_KEY etc. work as usual."""

    def __init__(self, project: str, run_dir: Path, config: dict[str, Any] | None) -> None:
        import hashlib

        import wandb

        self._wandb = wandb
        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self._run = wandb.init(
            project=project,
            dir=str(run_dir),
            name=run_dir.name,
            id=run_id,
            resume="allow",
            config=config or {},
        )

    def write(self, record: dict[str, Any]) -> None:
        self._run.log(scalars(record), step=int(record["step"]))

    def close(self) -> None:
        self._run.finish()


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a record (numbers, booleans, one-element tensors), without ``step``."""
    out = {}
    for key, value in record.items():
        if key == "step":
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (bool, int, float)):
            out[key] = float(value)
    return out


def wandb_project(configured: str | None = None) -> str | None:
    """The W&B project to log to: the config's, else WANDB_PROJECT; None (no W&B) when neither is
    set or ``wandb`` is not installed."""
    import importlib.util

    project = configured or os.environ.get("WANDB_PROJECT")
    if not project or importlib.util.find_spec("wandb") is None:
        return None
    return project


class MetricsWriter:
    """Fans each logged record out to metrics.jsonl, TensorBoard (``tensorboard/`` next to the jsonl
    file; on by default) and W&B (when installed and a project is configured). Rank 0 passes the
    jsonl path; the other ranks pass None and write nothing."""

    def __init__(
        self,
        path: Path | None,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        start_step: int = 0,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        self.path = path
        self.sinks: list[Any] = []
        if path is None:
            return
        self.sinks.append(JsonlSink(path))
        if tensorboard:
            purge = start_step + 1 if start_step > 0 else None
            self.sinks.append(TensorBoardSink(path.parent / "tensorboard", purge_step=purge))
        if wandb_project:
            self.sinks.append(WandbSink(wandb_project, path.parent, run_config))

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def json_safe(value: Any) -> Any:
    """``value`` with every NaN / inf (in nested dicts and lists too) written as a string, so
    ``json.dumps(..., allow_nan=False)`` gives valid JSON."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)  # JSON has no NaN/inf; keep them readable
    return value


class MetricsLogger:
    """The logging cadence of a run: a record is written every ``log_every`` steps, at the end and
    with every validation; each written record gains the step time's min, median and max over the
    ranks (one all-gather of one float per logged step), to show stragglers."""

    def __init__(self, writer: MetricsWriter, ctx: Any, log_every: int) -> None:
        self.writer, self.ctx, self.log_every = writer, ctx, log_every

    def due(self, record: dict[str, Any], at_end: bool) -> bool:
        """The same answer on every rank (the step, the end and validation are shared)."""
        return record["step"] % self.log_every == 0 or at_end or "val_loss_1" in record

    def log(self, record: dict[str, Any], at_end: bool) -> bool:
        """Write ``record`` when it is due (collective on those steps); True when written."""
        if not self.due(record, at_end):
            return False
        record.update(rank_spread(self.ctx, "step_time", float(record["step_time_s"])))
        self.writer.write(record)
        return True

    def close(self) -> None:
        self.writer.close()


def rank_spread(ctx: Any, name: str, value: float) -> dict[str, float]:
    """``{name}_min_s``, ``_median_s``, ``_max_s`` of ``value`` over the ranks (all-gather)."""
    import torch.distributed as dist

    mine = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    if ctx.distributed:
        values = [torch.empty_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(values, mine)
        every = torch.cat(values).cpu()
    else:
        every = mine.cpu()
    ordered = every.sort().values
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        f"{name}_min_s": float(ordered[0]),
        f"{name}_median_s": float(median),
        f"{name}_max_s": float(ordered[-1]),
    }


# Profiling and out-of-memory ------------------------------------------------------------------------
def memory_snapshot_on_oom(device: torch.device, run_dir: Path, rank: int) -> str:
    """After an out-of-memory error: the allocator's snapshot (segments, blocks and, when recording
    was on, the allocation stacks) to RUN/memory/oom-rank-R.pickle on a GPU, for
    https://pytorch.org/memory_viz; returns the line to print."""
    if device.type != "cuda":
        return (
            f"rank {rank}: out of memory on the {device.type}: no memory snapshot (the "
            "allocator snapshot, torch.cuda.memory._dump_snapshot, needs a GPU)"
        )
    path = run_dir / "memory" / f"oom-rank-{rank:05d}.pickle"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.cuda.memory._dump_snapshot(str(path))
    except Exception as exc:  # noqa: BLE001 - the OOM is re-raised by the caller either way
        return f"rank {rank}: out of memory; writing the memory snapshot failed: {exc!r}"
    return f"rank {rank}: out of memory; memory snapshot written to {path}"


class StepProfiler:
    """``train.profile_steps``: torch.profiler over the first ``steps`` steps of the run (CPU and,
    on a GPU, CUDA activity), written as a Chrome trace to RUN/profile/trace-rank-R.json (open it in
    https://ui.perfetto.dev or chrome://tracing). ``steps`` 0: nothing."""

    def __init__(self, steps: int, run_dir: Path, rank: int) -> None:
        self.left = int(steps)
        self.path = run_dir / "profile" / f"trace-rank-{rank:05d}.json"
        self._profile: Any = None
        if self.left > 0:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities, record_shapes=True)
            self._profile.__enter__()

    def step(self) -> None:
        """One training step done: the trace is written after the last profiled one."""
        if self._profile is None:
            return
        self._profile.step()
        self.left -= 1
        if self.left <= 0:
            self.close()

    def close(self) -> None:
        if self._profile is None:
            return
        profile, self._profile = self._profile, None
        profile.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        profile.export_chrome_trace(str(self.path))
        print(f"profile of the first steps written to {self.path}", flush=True)
