"""The JSON files a checkpoint holds (config.json, tokenizer_config.json), read as one object or
refused in one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: Path, error: type[Exception]) -> dict:
    """The JSON object in ``path``; ``error`` naming the file when it is not valid JSON or holds
    something other than an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise error(f"{path} holds a {type(value).__name__}, not a JSON object")
    return value
