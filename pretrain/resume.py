"""What ``--resume`` reads, and whether it may: the newest checkpoint that verifies (its manifest's
sizes and checksums, its optimizer state, finite weights), a fallback to an older one that is
said in one line, and the run's identity (corpus, tokenizer, model shape) compared with the
checkpoint's. Other configuration changes are allowed, printed as a diff and recorded.

A checkpoint that fails is moved to ``checkpoints/rejected/`` with the reason beside it, so the
resumed run never overwrites or prunes it. When no checkpoint can be resumed, the resume is refused
with one line naming each checkpoint tried and why.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from torch.distributed.checkpoint.api import CheckpointException

from cluster.context import DistContext
from recurrent_model.atomic_io import atomic_write_text
from recurrent_model.families import empty_model, family_of_config

from .checkpointing import (
    LATEST,
    CheckpointDirectory,
    MetricsFileError,
    ResumeError,
    _optimizer_source,
    read_state,
    rewind_metrics,
    saved_keys,
    saved_model_config,
)
from .integrity import MANIFEST, IntegrityError, part_of, read_manifest, verify_files

# What a checkpoint that cannot be read raises while a resume reads it (collectively).
READ_ERRORS = (ResumeError, OSError, ValueError, SafetensorError, CheckpointException)


class CheckpointRejected(ResumeError):
    """A checkpoint this resume cannot use (a resume falls back to an older one)."""


class IdentityError(ResumeError):
    """The run differs from the checkpoint's in data, tokenizer or model shape."""


def file_sha256(path: Path) -> str:
    """SHA-256 of a small file (the tokenizer), the same wherever xxhash is installed or not."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# Verification -------------------------------------------------------------------------------------
def verify_checkpoint(path: Path, ctx: DistContext, skip_optimizer: bool = False) -> list[str]:
    """Problems with the files of checkpoint ``path`` (empty: it verifies). Collective: each rank
    checks a share of the manifest's files; every rank returns every rank's findings."""
    mine: list[str] = []
    try:
        manifest = read_manifest(path)
        if manifest is None and read_state(path).get("manifest"):
            mine.append("manifest.json is missing")
    except (IntegrityError, ResumeError) as exc:
        manifest, mine = None, [str(exc)]
    if manifest is not None:
        files = {
            name: entry
            for name, entry in manifest["files"].items()
            if not (skip_optimizer and part_of(name) == "optimizer shard")
        }
        mine += verify_files(path, {**manifest, "files": files}, ctx.rank, ctx.world_size)
    found = [problem for part in ctx.all_gather_object(mine) for problem in part]
    return list(dict.fromkeys(found))


def check_optimizer_state(path: Path, state: dict[str, Any], parameters: set[str]) -> None:
    """Every optimizer tensor the checkpoint was saved with is present (CheckpointRejected, with
    the ``--reset-optimizer`` hint, when some are not)."""
    available = saved_keys(_optimizer_source(path))
    present = sum(key.rsplit(".", 1)[0] in parameters for key in available)
    expected = state.get("optimizer_tensors")
    if expected is None:  # saved without the count: any optimizer update leaves some state
        expected = 1 if state["step"] > state.get("skipped", 0) else 0
        missing = present == 0 and expected > 0
    else:
        missing = present < expected
    if missing:
        raise CheckpointRejected(
            f"its optimizer state is missing ({present} of {expected} optimizer tensors); "
            "pass --reset-optimizer to resume it with fresh optimizer state"
        )


def parameter_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of a model with ``config`` (its family's, on the meta device)."""
    return {name: tuple(p.shape) for name, p in empty_model(config).state_dict().items()}


# Identity -----------------------------------------------------------------------------------------
def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, list[Any]]:
    """Dotted key -> [checkpoint's value, this run's value] for every key that differs."""
    old, new = flatten(saved), flatten(current)
    return {
        k: [old.get(k), new.get(k)]
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    }


def check_identity(
    path: Path,
    state: dict[str, Any],
    model_config: Any,
    corpus_hash: str,
    tokenizer_hash: str,
    allow_data_change: bool,
) -> list[str]:
    """Refuse (IdentityError) a changed model shape, and a changed corpus or tokenizer unless
    ``allow_data_change``; returns the data changes that were allowed."""
    saved_model = saved_model_config(path)
    saved_family, family = family_of_config(saved_model), family_of_config(model_config)
    if saved_family != family:
        raise IdentityError(
            f"cannot resume from {path.name}: it holds a {saved_family.name} model, this run's "
            f"config a {family.name} one; resume with the same --config, --set and --init-from"
        )
    if parameter_shapes(saved_model) != parameter_shapes(model_config):
        fields = config_changes(saved_model.to_dict(), model_config.to_dict())
        diff = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in fields.items())
        raise IdentityError(
            f"cannot resume from {path.name}: the model's shape differs ({diff}); a resume keeps "
            "the shape: choose a new --out"
        )
    changed = []
    if state.get("corpus_hash") not in (None, corpus_hash):
        changed.append(
            f"the corpus changed (corpus_hash {state['corpus_hash'][:12]} -> {corpus_hash[:12]})"
        )
    if state.get("tokenizer_hash") not in (None, tokenizer_hash):
        changed.append("the tokenizer changed")
    if changed and not allow_data_change:
        raise IdentityError(
            f"cannot resume from {path.name}: {' and '.join(changed)}; pass --allow-data-change "
            "to continue on the new data, or choose a new --out"
        )
    return changed


# Choosing the checkpoint --------------------------------------------------------------------------
def resume_checkpoint(
    directory: CheckpointDirectory,
    ctx: DistContext,
    restore: Callable[[Path], None],
    reset_optimizer: bool = False,
) -> Path | None:
    """Restore the newest checkpoint of ``directory`` that verifies and loads (``restore`` reads
    it; it raises CheckpointRejected for a checkpoint that cannot be used). Older ones are tried
    in turn; the refused ones are set aside and each is named with its reason. None when there is
    no checkpoint. Collective."""
    candidates, notes = ctx.all_gather_object(directory.resume_candidates())[0]
    say = print if ctx.is_main else (lambda *a, **k: None)
    for note in notes:
        say(f"resume: {note}", flush=True)
    rejected: list[tuple[Path, str]] = []
    for path in candidates:
        problems = verify_checkpoint(path, ctx, skip_optimizer=reset_optimizer)
        if not problems:
            problems = _agreed_restore(ctx, restore, path)
        if not problems:
            _set_aside(directory, ctx, rejected, path, say, fell_back=bool(rejected or notes))
            if not (path / MANIFEST).exists():
                say(f"resume: {path.name} has no manifest (written before checksums): not verified")
            return path
        rejected.append((path, "; ".join(problems)))
        say(f"resume: {path.name} fails verification: {rejected[-1][1]}", flush=True)
    if rejected or notes:
        tried = "; ".join([*notes, *(f"{p.name}: {why}" for p, why in rejected)])
        hint = (
            "; --reset-optimizer resumes one without its optimizer state"
            if any("optimizer" in why for _, why in rejected) and not reset_optimizer
            else ""
        )
        raise ResumeError(
            f"--resume: no checkpoint in {directory.root} can be resumed ({tried}){hint}"
        )
    return None


def _agreed_restore(ctx: DistContext, restore: Callable[[Path], None], path: Path) -> list[str]:
    """``restore(path)`` on every rank; the problems any rank met (the same list on every rank)."""
    try:
        restore(path)
        mine = None
    except IdentityError:
        raise
    except READ_ERRORS as exc:
        mine = str(exc) if isinstance(exc, CheckpointRejected) else f"{type(exc).__name__}: {exc}"
    found = [m.splitlines()[0] for m in ctx.all_gather_object(mine) if m]
    return list(dict.fromkeys(found))


def _set_aside(
    directory: CheckpointDirectory,
    ctx: DistContext,
    rejected: list[tuple[Path, str]],
    chosen: Path,
    say: Callable[..., None],
    fell_back: bool,
) -> None:
    """Move the refused checkpoints out of the way (rank 0), point ``latest`` at ``chosen`` and
    say which checkpoint the run resumes from and why."""
    if ctx.is_main:
        kept = [directory.reject(path, why) for path, why in rejected]
        if fell_back:
            atomic_write_text(directory.root / LATEST, chosen.name + "\n")
            aside = ", ".join(str(k.relative_to(directory.root.parent)) for k in kept)
            say(
                f"resume: fell back to {chosen.name}, the newest checkpoint that verifies"
                + (f"; the refused one(s) kept as {aside}" if aside else ""),
                flush=True,
            )
    ctx.barrier()


# The metrics file ---------------------------------------------------------------------------------
def prepare_metrics_file(path: Path, resumed_from: Path | None, step: int) -> str | None:
    """Rank 0, before the first record: on a resume, rewind metrics.jsonl to ``step`` and drop a
    torn last line; on a fresh start, move an earlier launch's file aside (never append to it).
    Returns the MetricsFileError message for a damaged file, else None."""
    if resumed_from is None:
        if path.is_file() and path.stat().st_size:
            n = 1
            while (aside := path.with_name(f"{path.stem}.previous-{n}{path.suffix}")).exists():
                n += 1
            os.replace(path, aside)
            print(f"{path.name} of an earlier launch (no checkpoint) moved to {aside.name}")
        return None
    try:
        note = rewind_metrics(path, step)
    except MetricsFileError as exc:
        return str(exc)
    if note:
        print(f"resume: {note}", flush=True)
    return None
