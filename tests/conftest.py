"""Suite-wide fixtures."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

_MAIN = sys.modules["__main__"]  # pytest's own, captured before any test runs


@pytest.fixture(autouse=True)
def _restore_main_module() -> Iterator[None]:
    """Streamlit's AppTest installs the app script as ``sys.modules["__main__"]``; spawned worker
    processes of later tests (data preparation) would then re-run the app on start-up. Every test
    starts and ends with the real ``__main__``."""
    sys.modules["__main__"] = _MAIN
    yield
    sys.modules["__main__"] = _MAIN
