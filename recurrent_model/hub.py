"""Resolve a Hugging Face hub id ("org/name") to a local checkpoint directory.

`load_model` calls `resolve_checkpoint` for a path that does not exist: when it looks like a hub id,
the repository's snapshot is fetched through `huggingface_hub` (or found in its cache) and its
directory is returned. Only safetensors weights, their index, config.json and the tokenizer files
are downloaded, never pickled `.bin` weights. `HF_HUB_CACHE` (or `HF_HOME`) and offline mode
(`HF_HUB_OFFLINE=1`) are read when the call is made, so setting them after import works.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# What a checkpoint needs: weights (single file or shards + index), the config and the tokenizer.
ALLOW_PATTERNS = (
    "*.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[\w./-]+)?$")
_TRUE = {"1", "true", "yes", "on"}


class HubError(ValueError):
    """A hub id that could not be resolved to a local snapshot; the message says why."""


def looks_like_hub_id(path: str | os.PathLike) -> bool:
    """True for "org/name" (optionally "org/name@revision") strings that are not local paths."""
    text = os.fspath(path)
    if not isinstance(text, str) or text.startswith((".", "/", "~")) or "\\" in text:
        return False
    if ".." in text.split("@")[0]:
        return False
    return bool(_HUB_ID.match(text))


def split_revision(hub_id: str) -> tuple[str, str | None]:
    """("org/name", revision or None) from "org/name[@revision]"."""
    repo, _, revision = hub_id.partition("@")
    return repo, revision or None


def hub_cache_dir() -> Path:
    """The hub cache in effect now: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """Whether offline mode is on now (HF_HUB_OFFLINE, or the older TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def download_checkpoint(hub_id: str, revision: str | None = None) -> Path:
    """The local snapshot directory of hub repository `hub_id` (downloaded unless cached/offline).

    Raises HubError naming the id, the cache and the mode when the snapshot cannot be had.
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise HubError(f"{hub_id!r} looks like a hub id, but huggingface_hub is missing") from exc
    repo, at = split_revision(hub_id)
    revision = revision or at
    cache, offline = hub_cache_dir(), hub_offline()
    try:
        folder = snapshot_download(
            repo,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline,
            allow_patterns=list(ALLOW_PATTERNS),
        )
    except LocalEntryNotFoundError as exc:
        mode = "offline mode (HF_HUB_OFFLINE=1)" if offline else "no connection to the hub"
        raise HubError(
            f"hub id {hub_id!r} is not in the hub cache {cache} and {mode} prevents downloading it"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise HubError(f"could not fetch hub id {hub_id!r} into {cache}: {exc}") from exc
    return Path(folder)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A local directory for `path`: the path itself when it exists, when its parent folder exists
    (a typo under a local folder) or when it does not look like a hub id; else the hub snapshot."""
    local = Path(path)
    if local.exists() or local.parent.exists() or not looks_like_hub_id(path):
        return local
    return download_checkpoint(os.fspath(path))
