"""End-to-end in a real browser: `streamlit run` the app, drive it with Playwright and Debian's
Chromium, change the step count, wait for the plotly chart to redraw, and check for errors.

Chromium comes from `make browser` (.ci/ensure_chromium.sh); Playwright's own download does not
work on these machines, so the test fails (it is never skipped) when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
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
CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"streamlit exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"streamlit did not answer within {timeout} s:\n{log.read_text()}")


@pytest.fixture
def server(tmp_path) -> Iterator[str]:
    """The app served by `streamlit run` on a free localhost port; its URL."""
    port = free_port()
    log = tmp_path / "streamlit.log"
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "apps" / "trajectories.py"),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        "127.0.0.1",
        "--server.fileWatcherType",
        "none",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_change_steps_redraws_the_chart_without_errors(server, tmp_path):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (sh .ci/ensure_chromium.sh) first")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(server, wait_until="domcontentloaded")
            page.wait_for_selector(f"{CHART} .main-svg", timeout=180_000)
            steps = page.get_by_label("Steps", exact=True)
            steps.fill("9")
            steps.press("Enter")
            page.get_by_text(re.compile(r"· 9 steps ·")).wait_for(timeout=180_000)
            # the PC-pair panels redraw with one marker per state: 9 steps → s_0 … s_9
            page.wait_for_function(
                "sel => { const t = document.querySelector(sel)?.querySelector('.scatterlayer .trace');"
                " return t && t.querySelectorAll('.points path').length === 10; }",
                arg=CHART,
                timeout=120_000,
            )
            shot = tmp_path / "app.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            errors = page.locator('[data-testid="stException"]')
            assert errors.count() == 0, errors.all_inner_texts()
        finally:
            browser.close()
