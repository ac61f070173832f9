"""The running torch's release, for the code that reads torch internals checked on named releases."""

from __future__ import annotations

import re

import torch


def torch_release() -> tuple[int, int]:
    """(major, minor) of the running torch."""
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()  # type: ignore[union-attr]
    return int(major), int(minor)
