"""End-to-end in a real browser: `streamlit run` the app, drive it with Playwright and Debian's
Chromium, change the step count, wait for the plotly chart to redraw, and check for errors.

Chromium comes from `make browser` (.ci/ensure_chromium.sh); Playwright's own download does not
work on these machines, so the test fails (it is never skipped) when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from apps.serve import CHROMIUM, CHROMIUM_ARGS, free_port, start_streamlit, stop, wait_healthy

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
