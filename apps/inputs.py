"""Sidebar settings: parse and check what the user typed, and encode the prompt.

Every problem becomes an ``InputError`` whose message the app shows as is (never a traceback).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recurrent_model.hub import looks_like_hub_id
from recurrent_model.standin import REPO_ROOT

MAX_STEPS = 256
MAX_SEEDS = 8
MAX_INIT_SCALE = 10.0
DEFAULT_PROMPT = (
    "Claire makes a 3 egg omelet every morning for breakfast. "
    "How many dozens of eggs will she eat in 4 weeks?"
)


OWN_DTYPE = "checkpoint's own"
DTYPES = (OWN_DTYPE, "float32", "bfloat16", "float16")


def dtype_choice(shown: str) -> str | None:
    """The dtype picked in the sidebar as ``load_model`` takes it (None: the checkpoint's own)."""
    return None if shown == OWN_DTYPE else shown


class InputError(ValueError):
    """Input the app cannot run with; the message says what to change."""


@dataclass(frozen=True)
class PromptText:
    """The sidebar's input as typed: the prompt (or user message), the system message, and whether
    it is a chat; another model encodes it with its own tokenizer (``encode_input``)."""

    prompt: str
    system: str = ""
    chat: bool = False


@dataclass(frozen=True)
class RunSettings:
    """What one trajectory collection needs: token ids, steps, seeds and the init scale."""

    token_ids: tuple[int, ...]
    num_steps: int
    seeds: tuple[int, ...]
    init_scale: float


def resolve_checkpoint(text: str) -> Path:
    """The checkpoint directory typed in the sidebar; relative paths are taken from the repo root.

    A hub id ("org/name") that is no local directory is returned as is: `load_model` fetches it
    through the Hugging Face hub cache."""
    text = text.strip()
    if not text:
        raise InputError("Enter a checkpoint directory (e.g. checkpoints/default) or a hub id.")
    path = Path(text).expanduser()
    if not path.is_absolute() and not path.exists():
        local = path.parent.exists() or (REPO_ROOT / path).parent.exists()
        if not local and looks_like_hub_id(text):
            return Path(text)
        path = REPO_ROOT / path
    return path.resolve()


def parse_seeds(text: str) -> tuple[int, ...]:
    """Seeds typed as "0, 1, 2" (commas or spaces), each 0 … 2³¹ − 1, at most MAX_SEEDS, unique."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    if not parts:
        raise InputError("Enter at least one seed (e.g. 0, 1, 2).")
    try:
        seeds = tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(
            f"Seeds must be whole numbers separated by commas, got {text!r}."
        ) from None
    if any(s < 0 or s >= 2**31 for s in seeds):
        raise InputError(f"Seeds must lie between 0 and {2**31 - 1}, got {text!r}.")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"Seeds must be distinct, got {text!r}.")
    if len(seeds) > MAX_SEEDS:
        raise InputError(f"Use at most {MAX_SEEDS} seeds, got {len(seeds)}.")
    return seeds


def check_steps(steps: float | int | None) -> int:
    """The number of core iterations: a whole number in 1 … MAX_STEPS."""
    if steps is None or int(steps) != steps or not 1 <= steps <= MAX_STEPS:
        raise InputError(f"Steps must be a whole number from 1 to {MAX_STEPS}, got {steps}.")
    return int(steps)


def check_init_scale(scale: float | None) -> float:
    """The scale of the random initial state s_0: 0 (s_0 = 0) … MAX_INIT_SCALE."""
    if scale is None or not 0.0 <= scale <= MAX_INIT_SCALE:
        raise InputError(f"Init scale must lie between 0 and {MAX_INIT_SCALE:g}, got {scale}.")
    return float(scale)


def encode_input(
    tokenizer, block_size: int, prompt: str, system: str = "", chat: bool = False
) -> tuple[int, ...]:
    """Token ids of the prompt (BOS + text) or of a chat (system + user, assistant header opened)."""
    if tokenizer is None:
        raise InputError(
            "This checkpoint has no tokenizer.json, so the app cannot encode a prompt; "
            "add the tokenizer file next to config.json."
        )
    if not prompt.strip():
        raise InputError("The prompt is empty: type some text to run the model on.")
    if chat:
        messages = ([{"role": "system", "content": system}] if system.strip() else []) + [
            {"role": "user", "content": prompt}
        ]
        ids = tokenizer.encode_chat(messages)
    else:
        ids = tokenizer.encode(prompt)
    if len(ids) > block_size:
        raise InputError(
            f"The prompt is {len(ids)} tokens long but the model's context holds {block_size}: "
            "shorten it."
        )
    return tuple(int(i) for i in ids)
