"""End-to-end in a real browser: `streamlit run` the app, drive it with Playwright and Debian's
Chromium, change the step count, wait for the plotly chart to redraw, check for errors, then open
every tab and save a screenshot of each (to $APP_SCREENS when set, else the test's tmp_path) for a
person to look at.

Chromium comes from `make browser` (.ci/ensure_chromium.sh); Playwright's own download does not
work on these machines, so the test fails (it is never skipped) when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from apps.serve import (
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    screenshot_tabs,
    start_streamlit,
    stop,
    wait_healthy,
)
from apps.views import TABS, titles

pytestmark = pytest.mark.slow  # a real browser against `streamlit run`

CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot'


@pytest.fixture
def server(tmp_path) -> Iterator[str]:
    """The app served by `streamlit run` on a free localhost port; its URL."""
    port = free_port()
    log = tmp_path / "streamlit.log"
    with log.open("w") as out:
        proc = start_streamlit(port, out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log=log)
        yield url
    finally:
        stop(proc)


@pytest.mark.slow
def test_change_steps_redraws_the_chart_then_every_tab_renders(server, tmp_path):
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
            errors = page.locator('[data-testid="stException"]')
            assert errors.count() == 0, errors.all_inner_texts()
            assert page.get_by_role("tab").all_inner_texts() == titles()
            out = Path(os.environ.get("APP_SCREENS", tmp_path / "screens"))
            # the Training tab's analysis of four checkpoints is covered by test_app_training
            tabs = [replace(t, action=None) if t.title == "Training" else t for t in TABS]
            shots = screenshot_tabs(page, out, tabs)  # raises on a tab's exception
            assert list(shots) == titles()
            assert all(path.stat().st_size > 10_000 for path in shots.values())
        finally:
            browser.close()
