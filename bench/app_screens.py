"""Real-browser screenshots of every tab of the app (Chromium via Playwright), to look at.

Serves `apps/trajectories.py` with `streamlit run`, opens it in Debian's Chromium (`make browser`
installs it), sets a small run, opens each tab in turn (pressing its
Generate / Sample / Run button when it has one) and writes one full-page PNG per tab.

Usage: python bench/app_screens.py [--out /tmp/screens] [--steps 16] [--seeds "0, 1, 2"]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.serve import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    screenshot_tabs,
    start_streamlit,
    stop,
    wait_healthy,
    wait_idle,
)

CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg'


def set_run(page, steps: int, seeds: str) -> None:
    """Type the sidebar's steps and seeds, waiting for each rerun."""
    field = page.get_by_label("Steps", exact=True)
    field.fill(str(steps))
    field.press("Enter")
    wait_idle(page)
    field = page.get_by_label("Seeds", exact=True)
    field.fill(seeds)
    field.press("Enter")
    wait_idle(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/screens"))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", default="0, 1, 2")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: run `make browser` (sh .ci/ensure_chromium.sh) first")
    from playwright.sync_api import sync_playwright

    port = free_port()
    log = args.out / "streamlit.log"
    args.out.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        server = start_streamlit(port, out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, log=log)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": args.width, "height": 1000})
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector(CHART, timeout=300_000)
            set_run(page, args.steps, args.seeds)
            titles = page.get_by_role("tab").all_inner_texts()
            shots = screenshot_tabs(page, args.out, titles)
            browser.close()
    finally:
        stop(server)
    for title, path in shots.items():
        print(f"{title:20s} {path}")


if __name__ == "__main__":
    main()
