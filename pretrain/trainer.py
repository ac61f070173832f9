"""The training loop: lock-step depth, truncated backprop, the recipe's optimizer, checkpoints,
validation at several depths and telemetry. One ``Trainer`` per process (rank)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cluster.context import DistContext
from recurrent_model import HuginnTokenizer, hook_names, sample_depth

from .callbacks import TrainerCallback, notify
from .checkpoint_manager import CheckpointManager, Snapshot
from .checkpointing import (
    CheckpointDirectory,
    capture_rng,
    load_model_shards,
    load_optimizer_shards,
    model_tensors,
    optimizer_tensors,
    parameter_names,
    read_rank_state,
    read_state,
    restore_rng,
)
from .config import TrainConfig
from .curriculum import mean_recurrence_at
from .distributed import build_model, local_optimizer, preflight_all_reduce
from .integrity import nonfinite_tensor
from .loss_guard import LossGuard
from .metrics import (
    MetricsLogger,
    MetricsWriter,
    StepProfiler,
    flops_per_token,
    memory_snapshot_on_oom,
    memory_stats,
    peak_flops,
    recurrence_health,
    wandb_project,
)
from .optimizer import ClippedAtanAdam, clip_grads_, global_grad_norm, parameter_groups
from .precision import resolve_precision
from .resume import (
    CheckpointRejected,
    MetricsFileError,
    check_identity,
    check_optimizer_state,
    config_changes,
    file_sha256,
    prepare_metrics_file,
    resume_checkpoint,
)
from .schedule import Schedule
from .startup_checks import check_fused_attention
from .strategy import from_config
from .watchdog import Watchdog, process_groups, set_collective_timeout

HEALTH_HOOKS = (hook_names.STATE, hook_names.E, hook_names.LATENT, hook_names.FINAL_NORM)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss stayed non-finite); the message says why."""


class RunDirectoryError(TrainingError):
    """The output directory holds a run this launch would overwrite; the message says what to do."""


def refuse_existing_run(out: Path, resume: bool) -> None:
    """A launch without ``--resume`` into a directory holding checkpoints would restart at step 0
    and later prune the newer checkpoints: refuse before anything in ``out`` changes."""
    if resume:
        return
    directory = CheckpointDirectory(out / "checkpoints")
    steps = directory.steps()
    if steps:
        raise RunDirectoryError(
            f"{out} already holds checkpoints (up to step {steps[-1]}): pass --resume to "
            "continue that run, or choose a new --out"
        )


def prepare(config: TrainConfig, data_dir: Path, ctx: DistContext, progress: bool) -> Any:
    """The prepared data, from its manifest. With ``data.prepare_in_job`` rank 0 first builds it
    when missing or stale while the others wait; without, every rank only checks the manifest (no
    corpus read) and fails fast when ``pretrain/prepare.py`` has not run."""
    from pretrain.data import load_prepared, open_prepared

    data = config.data.data_config()
    if not config.data.prepare_in_job:
        return load_prepared(data_dir, data)
    if ctx.is_main:
        prepared = open_prepared(
            data, data_dir, build=True, progress=progress, workers=config.data.workers
        )
    ctx.barrier()
    if not ctx.is_main:
        prepared = load_prepared(data_dir, data)
    return prepared


class Trainer:
    """Trains ``config`` into ``out_dir``; ``run()`` returns a summary dict. ``callbacks`` see the
    run, its steps and its batches (pretrain/callbacks.py)."""

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | Path,
        ctx: DistContext,
        resume: bool = False,
        max_steps: int | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        allow_data_change: bool = False,
        reset_optimizer: bool = False,
    ) -> None:
        self.config, self.ctx = config, ctx
        self.allow_data_change, self.reset_optimizer = allow_data_change, reset_optimizer
        self.config_changes: dict[str, list[Any]] = {}
        self.callbacks = list(callbacks)
        self.out = Path(out_dir)
        refuse_existing_run(self.out, resume)
        self.train_cfg = config.train
        self.stop_at = min(config.train.max_steps, max_steps or config.train.max_steps)
        self.device = ctx.device
        self.precision = resolve_precision(config.train.precision, self.device.type)
        self.bf16 = self.precision.bf16
        self._signal: int | None = None
        self.step = 0
        self.skipped = 0
        self.tokens = 0
        self.out.mkdir(parents=True, exist_ok=True)
        if config.train.threads:
            torch.set_num_threads(int(config.train.threads))
        self._limit = 60.0 * config.distributed.timeout_minutes  # the collective timeout now
        self.watchdog = Watchdog(self.out, ctx.rank, config.distributed.stop_grace_s)
        try:
            self._arm("start-up")
            self._build(resume)
            self.watchdog.disarm()
        except Exception as exc:
            self.watchdog.close()
            failure = self.watchdog.failure(exc, self._limit)
            if failure is None:
                raise
            raise failure from exc

    def _arm(self, label: str) -> None:
        """Watch a phase of a multi-rank run: a stack dump when it outlasts the collective
        timeout (pretrain/watchdog.py)."""
        if self.ctx.distributed:
            self.watchdog.arm(label, self._limit)

    def _shorten_timeouts(self) -> None:
        """After the first step of a launch: every group's collectives (the checkpoints' too)
        time out after ``distributed.step_timeout_s`` instead of the start-up length."""
        seconds = self.config.distributed.step_timeout_s
        if self.ctx.distributed:
            self.ctx.barrier()  # no rank waits under the short timeout on one still in step 1
            set_collective_timeout(process_groups(self.model, [self.checkpoints.group]), seconds)
        self._limit = seconds

    # Set-up ----------------------------------------------------------------------------------------
    def _build(self, resume: bool) -> None:
        cfg, t = self.config, self.train_cfg
        data_dir = Path(cfg.data.cache_dir) if cfg.data.cache_dir else self.out / "data"
        self.prepared = prepare(cfg, data_dir, self.ctx, t.progress and self.ctx.is_main)
        self.model_config = cfg.model_config()
        self.curriculum = cfg.curriculum()
        if self.prepared.vocab_size != self.model_config.vocab_size:
            raise TrainingError(
                f"the prepared data has vocab_size {self.prepared.vocab_size} but the model "
                f"{self.model_config.vocab_size}; set data.vocab_size (the model follows it)"
            )
        self._build_model()
        self.checkpoints = CheckpointManager(
            CheckpointDirectory(self.out / "checkpoints", t.keep_last),
            self.ctx,
            asynchronous=cfg.distributed.async_checkpoint,
            checkpoint_every=t.checkpoint_every,
            export_every=t.export_every,
            export_dtype=t.export_dtype,
        )
        self.schedule = Schedule(
            t.lr, t.warmup_steps, t.max_steps, t.cooldown_steps, t.min_lr_ratio
        )
        # s_0 noise: a per-rank generator whose state is part of the checkpoint.
        self.noise = torch.Generator(self.device).manual_seed(
            1_000_003 * (t.seed + 1) + self.ctx.rank
        )
        self._build_loader()
        self.tokenizer_hash = file_sha256(self.prepared.tokenizer_path)
        self.guard = LossGuard(
            t.max_skipped_steps, t.loss_spike_factor, t.loss_spike_window, t.loss_spike_action
        )
        latest = None
        if resume:
            latest = resume_checkpoint(
                self.checkpoints.directory, self.ctx, self._restore, self.reset_optimizer
            )
        if latest is None and resume and self.ctx.is_main:
            print(f"--resume: no checkpoint in {self.checkpoints.directory.root}; starting at 0")
        self.tokens_per_step = (
            t.micro_batch_size * t.grad_accum * self.prepared.block_size * self.ctx.world_size
        )
        self.resumed_from = latest
        self.peak, self.peak_source = peak_flops(
            self.device, self.bf16, self.model_config, t.micro_batch_size * cfg.data.block_size
        )

    def _build_model(self) -> None:
        """The model on this rank's device, wrapped for the strategy, and its optimizer."""
        cfg, t = self.config, self.train_cfg
        model_cfg = self.model_config
        torch.manual_seed(t.seed)
        note = check_fused_attention(self.device, self.precision, model_cfg, cfg.data.block_size)
        if self.ctx.is_main:
            print(note)
        if cfg.distributed.preflight_mb > 0:
            times = preflight_all_reduce(self.ctx, int(cfg.distributed.preflight_mb * 2**20))
            if self.ctx.is_main:
                print(
                    f"preflight: {len(times)} all-reduces up to {cfg.distributed.preflight_mb} "
                    f"MiB in {sum(times):.2f} s"
                )
        self.strategy = from_config(cfg.distributed)
        self.model, self.wrapped = build_model(
            model_cfg,
            self.ctx,
            self.precision,
            self.strategy,
            seed=t.seed,
            activation_checkpointing=t.activation_checkpointing,
            compile_blocks=t.compile,
            init_from=cfg.model.init_from,
        )
        self.model.tokenizer = HuginnTokenizer.from_file(self.prepared.tokenizer_path)
        self.params = list(dict.fromkeys(self.model.parameters()))  # FSDP swaps in DTensors
        self.names = parameter_names(self.model)
        groups = parameter_groups(self.model, t.weight_decay)
        hyper = dict(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay)
        self.optimizer = self.strategy.build_optimizer(groups, self.ctx, ClippedAtanAdam, **hyper)

    def _build_loader(self) -> None:
        from pretrain.data import PackedLoader

        t = self.train_cfg
        self.loader = PackedLoader(
            self.prepared,
            split="train",
            batch_size=t.micro_batch_size,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            seed=t.seed,
        )
        self.loader_iter: Iterator = iter(self.loader)

    def _open_metrics(self) -> None:
        """run.json (or run-resume-N.json) and the metrics sinks, rewound to the resumed step."""
        t = self.train_cfg
        metrics_path = self.out / "metrics.jsonl"
        problem = None
        if self.ctx.is_main:
            self._write_run_info(resumed_from=self.resumed_from)
            problem = prepare_metrics_file(metrics_path, self.resumed_from, self.step)
        problem = self.checkpoints.shared(problem)
        if problem:
            raise MetricsFileError(problem)
        writer = MetricsWriter(
            metrics_path if self.ctx.is_main else None,
            tensorboard=t.tensorboard,
            wandb_project=wandb_project(t.wandb_project),
            start_step=self.step,
            run_config=self.config.to_dict(),
        )
        self.metrics = MetricsLogger(writer, self.ctx, t.log_every)

    def _write_run_info(self, resumed_from: Path | None) -> None:
        """OUT/run.json: what produced this run (config, data, versions), for provenance."""
        import json
        import platform
        import sys

        info = {
            "command": " ".join(sys.argv),
            "config": self.config.to_dict(),
            "model": self.model_config.to_dict(),
            "init_from": self.config.model.init_from,
            "parameters": self.model.num_parameters(),
            "corpus_hash": self.prepared.corpus_hash,
            "train_rows": self.prepared.train_rows,
            "val_rows": self.prepared.val_rows,
            "world_size": self.ctx.world_size,
            "device": str(self.device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "resumed_from": str(resumed_from) if resumed_from else None,
            "started_at_step": self.step,
            "config_changes": self.config_changes,
        }
        name = "run.json" if resumed_from is None else f"run-resume-{self.step:07d}.json"
        (self.out / name).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")

    def _restore(self, path: Path) -> None:
        """Weights, optimizer moments, counters, data position and RNG from a checkpoint written
        by any number of ranks (each rank reads only the slices it holds and its own state)."""
        state = read_state(path)
        data_changes = check_identity(
            path,
            state,
            self.model_config,
            self.prepared.corpus_hash,
            self.tokenizer_hash,
            self.allow_data_change,
        )
        self._load_tensors(path, state)
        self.step, self.skipped, self.tokens = state["step"], state["skipped"], state["tokens"]
        if data_changes:
            self._restart_data(path, state, data_changes)
        elif state["world_size"] == self.ctx.world_size:
            mine = read_rank_state(path, self.ctx.rank, state)
            self.loader.load_state_dict(mine["loader"])
            for note in restore_rng(mine["rng"], {"noise": self.noise}, self.device):
                print(f"rank {self.ctx.rank}: resume: {note}", flush=True)
        else:
            self._redeal_data(self._old_loader_states(path, state))
        self.loader_iter = iter(self.loader)
        self._note_config_changes(path, state)
        if self.ctx.is_main:
            print(f"resumed from {path} at step {self.step}")

    def _load_tensors(self, path: Path, state: dict[str, Any]) -> None:
        """Weights and (unless --reset-optimizer) moments; CheckpointRejected when the optimizer
        state is missing or the weights hold NaN or inf (the same verdict on every rank)."""
        group, optimizer = self.checkpoints.group, local_optimizer(self.optimizer)
        optimizer.state.clear()  # a rejected checkpoint tried before leaves nothing behind
        load_model_shards(self.model, path, group)
        if self.reset_optimizer:
            if self.ctx.is_main:
                print(
                    f"--reset-optimizer: {path.name}'s optimizer state is not read; it starts fresh"
                )
        else:
            check_optimizer_state(path, state, set(self.names.values()))
            load_optimizer_shards(optimizer, self.names, path, group)
        bad = [
            b for b in self.ctx.all_gather_object(nonfinite_tensor(model_tensors(self.model))) if b
        ]
        if bad:
            raise CheckpointRejected(f"its weights hold non-finite values ({bad[0]})")

    def _restart_data(self, path: Path, state: dict[str, Any], changes: list[str]) -> None:
        """--allow-data-change: the new data is read from its start; RNG states carry over."""
        if state["world_size"] == self.ctx.world_size:
            mine = read_rank_state(path, self.ctx.rank, state)
            restore_rng(mine["rng"], {"noise": self.noise}, self.device)
        if self.ctx.is_main:
            print(
                f"resume: {' and '.join(changes)}; --allow-data-change: training goes on from "
                "the start of the new data"
            )

    def _note_config_changes(self, path: Path, state: dict[str, Any]) -> None:
        """Print the configuration keys that differ from the checkpoint's; they are recorded in
        run-resume-N.json and the first metrics record."""
        self.config_changes = config_changes(state.get("config", {}), self.config.to_dict())
        if self.config_changes and self.ctx.is_main:
            diff = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in self.config_changes.items())
            print(f"resume: the config differs from {path.name}'s: {diff}")

    def _old_loader_states(self, path: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
        """Every saved rank's loader state, for a resume on another rank count: rank 0 reads the
        files and sends them to the others (one read per file, not one per rank and file)."""
        states = None
        if self.ctx.is_main:
            states = [read_rank_state(path, r, state)["loader"] for r in range(state["world_size"])]
        return self.checkpoints.shared(states)

    def _redeal_data(self, old: list[dict[str, Any]]) -> None:
        """Resume on a different number of ranks: the loader's state is the global data position
        (the same on every old rank); the new ranks deal out every row the old ones had not read
        yet, each exactly once (pretrain/data/loader.py). Counts, optimizer and weights carry
        over exactly."""
        self.loader.load_state_dict(old[0])
        seed = [self.train_cfg.seed, self.step, self.ctx.rank, self.ctx.world_size]
        self.noise.manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        if self.ctx.is_main:
            print(
                f"resuming {len(old)}-rank state on {self.ctx.world_size} ranks: the unread rows "
                "re-dealt (each still read once), s_0 noise re-seeded per rank"
            )

    # Signals ---------------------------------------------------------------------------------------
    def _install_signals(self) -> dict[int, Any]:
        previous = {}

        def handler(signum: int, frame: Any) -> None:
            self._signal = signum

        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                if self.ctx.is_main and not previous:
                    print(
                        "signals: the trainer runs off the main thread and cannot install its "
                        "SIGTERM/SIGUSR1 handlers: a signal ends the process without a checkpoint",
                        flush=True,
                    )
                break
        if previous and self.ctx.distributed:  # SIGTERM's deadline, for a rank blocked in a
            self.watchdog.watch_signals()  # collective (one process has none to block in)
        return previous

    # One optimizer step ----------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        return self.precision.autocast()

    def _forward_backward(self, depth: Any) -> torch.Tensor:
        """Forward and backward of the grad_accum micro-batches at ``depth``, each under the
        strategy's sync context, then the strategy's after-backward; returns the summed loss."""
        t = self.train_cfg
        total_loss = torch.zeros((), device=self.device)
        for micro in range(t.grad_accum):
            inputs, labels = next(self.loader_iter)
            notify(self.callbacks, "on_batch", self, inputs, labels)
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            last = micro == t.grad_accum - 1
            sync = self.strategy.sync_context(self.model, self.wrapped, self.ctx, last)
            with sync, self.autocast():
                out = self.wrapped(
                    inputs,
                    num_steps=depth.total,
                    labels=labels,
                    backprop_depth=depth.grad,
                    generator=self.noise,
                )
                loss = out.loss / t.grad_accum
            loss.backward()
            total_loss += loss.detach()
        self.strategy.after_backward(self.model, self.params, self.ctx)
        return total_loss

    def train_step(self) -> dict[str, Any]:
        """Forward/backward over grad_accum micro-batches at the lock-step depth, then one update."""
        t = self.train_cfg
        mean_recurrence = mean_recurrence_at(
            self.curriculum, self.model_config.mean_recurrence, self.step
        )
        depth = sample_depth(self.step, mean_recurrence, self.config.backprop_depth, seed=t.seed)
        self.wrapped.train()
        start = time.perf_counter()
        total_loss = self._forward_backward(depth)
        grad_norm = global_grad_norm(self.params)
        lr = self.schedule.apply(self.optimizer, self.step)
        loss_value = float(self.ctx.all_reduce(total_loss)) / self.ctx.world_size
        verdict = self.guard.check(self.step + 1, loss_value, grad_norm)  # may stop the run
        skipped = verdict == "skip"
        if skipped:
            self.skipped += 1
        else:
            clip_grads_(self.params, t.grad_clip, grad_norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.step += 1
        self.tokens += self.tokens_per_step
        tok_s = self.tokens_per_step / elapsed
        flops = flops_per_token(self.model_config, depth, self.prepared.block_size)
        record: dict[str, Any] = {
            "step": self.step,
            "loss": loss_value,
            "grad_norm": grad_norm,
            "lr": lr,
            "mean_recurrence": mean_recurrence,
            "depth_no_grad": depth.no_grad,
            "depth_grad": depth.grad,
            "tokens": self.tokens,
            "tokens_per_s": tok_s,
            "flops_per_s_per_device": flops * tok_s / self.ctx.world_size,
            "skipped_steps": self.skipped,
            "step_time_s": elapsed,
        }
        if self.peak:
            record["mfu"] = record["flops_per_s_per_device"] / self.peak
        if skipped:
            record["skipped"] = True
        if verdict == "spike":
            record["loss_spike"] = True
        if self.config_changes and self.step == self._first_step + 1:
            record["config_changes"] = self.config_changes
        return record

    # Evaluation ------------------------------------------------------------------------------------
    def _val_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from pretrain.data import PackedLoader

        loader = PackedLoader(
            self.prepared,
            split="val",
            batch_size=self.train_cfg.micro_batch_size,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            seed=0,
        )
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) >= self.train_cfg.val_batches:
                break
        n = torch.tensor([float(len(batches))], device=self.device)
        if self.ctx.distributed:  # equal counts on every rank (FSDP forwards are collectives)
            torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MIN)
        return batches[: int(n.item())]

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Mean validation loss at each configured depth (no gradient, fixed s_0 noise)."""
        batches = self._val_batches()
        if not batches:
            return {}
        self.model.eval()
        out: dict[str, float] = {}
        for d in self.config.val_depths():
            gen = torch.Generator(self.device).manual_seed(12345 + self.ctx.rank)
            total = torch.zeros(2, device=self.device)
            for inputs, labels in batches:
                inputs, labels = inputs.to(self.device), labels.to(self.device)
                with self.autocast():
                    res = self.model(inputs, num_steps=d, labels=labels, generator=gen)
                total += torch.stack(
                    [
                        res.loss.float() * labels.numel(),
                        torch.tensor(float(labels.numel()), device=self.device),
                    ]
                )
            self.ctx.all_reduce(total)
            out[f"val_loss_{d}"] = float(total[0] / total[1])
        self.model.train()
        return out

    @torch.no_grad()
    def health(self) -> dict[str, float]:
        """Recurrence health on one validation sequence at the mean depth."""
        batches = self._val_batches()
        if not batches:
            return {}
        inputs = batches[0][0][:1].to(self.device)
        self.model.eval()
        gen = torch.Generator(self.device).manual_seed(777)
        sharded = hasattr(self.model, "unshard")  # FSDP2: run_with_cache bypasses the root hooks
        if sharded:
            self.model.unshard()  # type: ignore[operator]
        with self.autocast():
            _, cache = self.model.run_with_cache(
                inputs,
                num_steps=self.model_config.mean_recurrence,
                names_filter=list(HEALTH_HOOKS),
                generator=gen,
            )
        if sharded:
            self.model.reshard()  # type: ignore[operator]
        self.model.train()
        return recurrence_health(*(cache[name] for name in HEALTH_HOOKS))

    # Checkpoints -----------------------------------------------------------------------------------
    def snapshot(self, final: bool = False) -> Snapshot:
        """This rank's part of a checkpoint at the current step."""
        rank_state = {
            "loader": self.loader.state_dict(),
            "rng": capture_rng({"noise": self.noise}, self.device),
        }
        state = {
            "step": self.step,
            "skipped": self.skipped,
            "tokens": self.tokens,
            "world_size": self.ctx.world_size,
            "strategy": self.strategy.name,
            "schedule": asdict(self.schedule),
            "config": self.config.to_dict(),
            "corpus_hash": self.prepared.corpus_hash,
            "tokenizer_hash": self.tokenizer_hash,
        }
        optimizer = optimizer_tensors(local_optimizer(self.optimizer), self.names)
        return Snapshot(self.step, self.model, optimizer, rank_state, state, final)

    def save(self, final: bool = False) -> Path | None:
        """Start the checkpoint of the current step (see ``CheckpointManager.save``)."""
        self._saved_step = self.step
        return self.checkpoints.save(self.snapshot(final))

    # The loop --------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train from the current step to the stop step; checkpoints, validation and telemetry.
        The callbacks see the start and the summary."""
        notify(self.callbacks, "on_run_start", self)
        try:
            summary = self._train()
        finally:
            self.watchdog.close()
        notify(self.callbacks, "on_run_end", self, summary)
        return summary

    def _train(self) -> dict[str, Any]:
        """``run`` without the callbacks' start and end."""
        started = time.perf_counter()
        if self.step >= self.stop_at:
            return self._nothing_to_train(started)
        self._open_metrics()
        self._first_step = self.step
        previous = self._install_signals()
        bar = self._progress_bar()
        self._saved_step = self.step if self.resumed_from is not None else -1
        record: dict[str, Any] = {}
        profiler = StepProfiler(self.train_cfg.profile_steps, self.out, self.ctx.rank)
        try:
            record = self._loop(bar, profiler)
            self._arm("the last checkpoint")
            if self._saved_step != self.step:
                self.save(final=self.step >= self.stop_at)
            self.checkpoints.wait()
        except Exception as exc:
            failure = self.watchdog.failure(exc, self._limit)
            if failure is None:
                raise
            self.checkpoints.drop_pending()  # its collectives would wait on the lost peer
            raise failure from exc
        finally:
            profiler.close()
            if bar is not None:
                bar.close()
            self.metrics.close()
            self.checkpoints.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._summary(record, started)

    def _loop(self, bar: Any, profiler: StepProfiler) -> dict[str, Any]:
        """The steps until the stop step or an agreed signal; returns the last record."""
        record: dict[str, Any] = {}
        while self.step < self.stop_at:
            self._arm(f"step {self.step + 1}")
            notify(self.callbacks, "on_step_start", self)
            record = self._guarded_step()
            notify(self.callbacks, "on_step_end", self, record)
            profiler.step()
            self._report_guard(record, bar)
            at_end = self.step >= self.stop_at
            self._evaluate(record, at_end)
            self.metrics.log(record, at_end)
            self._show(bar, record)
            stop = self._checkpoint(at_end, bar)
            self.watchdog.disarm()
            if stop:
                break
            if self.step == self._first_step + 1:
                self._shorten_timeouts()
        return record

    def _guarded_step(self) -> dict[str, Any]:
        """``train_step``; on out-of-memory a memory snapshot goes to the run directory first."""
        try:
            return self.train_step()
        except torch.OutOfMemoryError:
            print(memory_snapshot_on_oom(self.device, self.out, self.ctx.rank), flush=True)
            raise

    def _report_guard(self, record: dict[str, Any], bar: Any) -> None:
        """One line for a skipped update or a warned loss spike (rank 0)."""
        if not self.ctx.is_main:
            return
        if record.get("skipped"):
            self._say(
                bar,
                f"step {self.step}: non-finite gradient norm or loss (loss {record['loss']}, "
                f"gradient norm {record['grad_norm']}); update skipped ({self.skipped} skipped "
                "so far)",
            )
        if record.get("loss_spike"):
            self._say(
                bar,
                f"step {self.step}: loss spike: {record['loss']:.4g} is above "
                f"{self.train_cfg.loss_spike_factor:g} x its running median (update applied)",
            )

    def _evaluate(self, record: dict[str, Any], at_end: bool) -> None:
        t = self.train_cfg
        if self.step % t.health_every == 0 or at_end:
            record.update(self.health())
        if self.step % t.val_every == 0 or at_end:
            record.update(self.validate())
        record.update(memory_stats(self.device))

    def _checkpoint(self, at_end: bool, bar: Any) -> bool:
        """Publish a finished background save; save on the cadence, at the end, or when any rank
        got SIGTERM/SIGUSR1 (agreed by a collective). True: stop now."""
        stop = self.ctx.any(self._signal is not None)
        self.checkpoints.poll()
        if stop:
            self.watchdog.stop_agreed()  # the save below runs under the collective timeout
        if self.step % self.train_cfg.checkpoint_every == 0 or at_end or stop:
            self.save(final=at_end)
        if stop:
            self.checkpoints.wait()
            self._say(
                bar,
                f"signal received: checkpoint at step {self.step} written, "
                "stopping (resume with --resume)",
            )
        return stop

    def _nothing_to_train(self, started: float) -> dict[str, Any]:
        """A resume at or past the stop step: say so; write nothing."""
        if self.ctx.is_main:
            print(
                f"the run in {self.out} is at step {self.step}, at or past the stop step "
                f"{self.stop_at} (--max-steps / train.max_steps): nothing to train",
                flush=True,
            )
        self.checkpoints.close()
        summary = self._summary({}, started)
        summary["nothing_to_train"] = True
        return summary

    def _summary(self, record: dict[str, Any], started: float) -> dict[str, Any]:
        latest = self.checkpoints.directory.latest()
        return {
            "step": self.step,
            "skipped": self.skipped,
            "tokens": self.tokens,
            "wall_s": time.perf_counter() - started,
            "last": record,
            "latest": str(latest),
            "rank_state_bytes": self.checkpoints.rank_state_bytes,
        }

    # Progress --------------------------------------------------------------------------------------
    def _progress_bar(self) -> Any:
        """The progress bar on rank 0 (log lines instead when not on a TTY), after one line
        naming the model and the step."""
        if not self.ctx.is_main:
            return None
        print(
            f"model {self.model_config.shape_summary()}, "
            f"{self.model.num_parameters() / 1e6:.2f}M parameters; "
            f"{self.tokens_per_step} tokens/step; peak {self.peak_source}"
        )
        if not self.train_cfg.progress:
            return None
        from .progress import progress_bar

        return progress_bar(total=self.stop_at, initial=self.step, desc="train")

    def _show(self, bar: Any, record: dict[str, Any]) -> None:
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                loss=f"{record['loss']:.3f}",
                gnorm=f"{record['grad_norm']:.2f}",
                lr=f"{record['lr']:.1e}",
                tok_s=f"{record['tokens_per_s']:.0f}",
                mfu=f"{record.get('mfu', 0):.2f}",
                r=f"{record['depth_no_grad']}+{record['depth_grad']}",
            )
        if any(k.startswith("val_loss_") for k in record) and self.ctx.is_main:
            vals = " ".join(
                f"{k[9:]}:{v:.3f}" for k, v in record.items() if k.startswith("val_loss_")
            )
            self._say(bar, f"step {self.step} val loss by depth {vals}")

    @staticmethod
    def _say(bar: Any, message: str) -> None:
        if bar is not None:
            bar.write(message)
        else:
            print(message, flush=True)
