"""Serve the app with `streamlit run` on a free localhost port and open it in Debian's Chromium.

Shared by the browser end-to-end test and the app benchmark.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from .views import Tab

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "apps" / "trajectories.py"
CHROMIUM = Path("/usr/bin/chromium")
# Headless, and no background connections: this machine's network is closed.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_streamlit(port: int, output: IO | int = subprocess.DEVNULL) -> subprocess.Popen:
    """`streamlit run apps/trajectories.py` headless on 127.0.0.1:port, output to ``output``."""
    cmd = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.headless", "true", "--server.port", str(port),
        "--server.address", "127.0.0.1", "--server.fileWatcherType", "none",
    ]  # fmt: skip
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 120, log: Path | None = None):
    """Block until the server answers its health check; raise RuntimeError if it dies or stalls."""
    tail = lambda: log.read_text() if log is not None and log.exists() else ""  # noqa: E731
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with {server.returncode}:\n{tail()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"streamlit did not answer within {timeout} s:\n{tail()}")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


RUNNING = '[data-testid="stStatusWidget"]'
EXCEPTION = '[data-testid="stException"]'
# apps.ui.estimate_gate's button: "Run (≈ 40 s (…))", shown when an estimate is over HEAVY_SECONDS
HEAVY_RUN = re.compile(r"^Run \(")


def wait_idle(page, timeout_ms: int = 300_000) -> None:
    """Wait until the script run the last interaction started has finished."""
    page.wait_for_timeout(700)  # the status widget appears a moment after the rerun starts
    page.wait_for_selector(RUNNING, state="detached", timeout=timeout_ms)


def full_height(page, most: int = 8000) -> None:
    """Make the viewport as tall as the page's content (Streamlit scrolls inside its main block,
    so a full-page screenshot alone shows only the first screen)."""
    height = page.evaluate(
        "() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
        " return m ? m.scrollHeight : document.body.scrollHeight; }"
    )
    width = page.viewport_size["width"]
    page.set_viewport_size({"width": width, "height": min(max(int(height), 800), most)})
    page.wait_for_timeout(500)  # plotly redraws at the new size


def shown_tabs() -> list[Tab]:
    """The app's tabs in display order, as the page draws them (``apps.views.TABS``)."""
    from . import views  # the tabs import streamlit and the model: only when a page is driven

    return list(views.TABS)


def screenshot_tabs(
    page,
    out_dir: Path,
    tabs: Sequence[Tab] | None = None,
    prepare: Mapping[str, Callable[[object], None]] | None = None,
) -> dict[str, Path]:
    """Open every tab (default: ``shown_tabs()``) of the served app in ``page`` (its first tab
    already drawn), call its ``prepare`` step when there is one (e.g. type a directory), press its
    ``action`` button or toggle when it has one, and save a full-page screenshot per tab."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = {}
    width = page.viewport_size["width"]
    for index, tab in enumerate(shown_tabs() if tabs is None else tabs):
        page.set_viewport_size({"width": width, "height": 1000})
        page.get_by_role("tab", name=tab.title, exact=True).click()
        wait_idle(page)
        if prepare and tab.title in prepare:
            prepare[tab.title](page)
        if tab.action is not None and page.get_by_text(tab.action, exact=True).count():
            run_action(page, tab.action)
        errors = page.locator(EXCEPTION)
        if errors.count():
            raise RuntimeError(f"tab {tab.title!r} shows an exception: {errors.all_inner_texts()}")
        path = out_dir / f"{index:02d}-{tab.title.lower().replace(' ', '_')}.png"
        full_height(page)
        page.screenshot(path=str(path), full_page=True)
        shots[tab.title] = path
    return shots


def run_action(page, label: str) -> None:
    """Press the button or toggle labelled ``label`` and approve its estimate when it is heavy."""
    page.get_by_text(label, exact=True).first.click()
    wait_idle(page)
    approve = page.get_by_role("button", name=HEAVY_RUN)
    if approve.count():
        approve.first.click()
        wait_idle(page)
