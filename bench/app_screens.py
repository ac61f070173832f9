"""Real-browser screenshots of every tab of the app (Chromium via Playwright), to look at.

Serves `apps/trajectories.py` with `streamlit run`, opens it in Debian's Chromium (`make browser`
installs it), sets a small run, opens each tab in turn (pressing its
Generate / Sample / Run button when it has one) and writes one full-page PNG per tab. The Corpus
tab opens a small corpus run of the shipped model (made in OUT/corpus unless --corpus names one)
and chooses one row of its token table.

Usage: python bench/app_screens.py [--out /tmp/screens] [--steps 16] [--seeds "0, 1, 2"]
       [--corpus DIR] [--tabs Corpus,Dynamics]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.serve import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    screenshot_tabs,
    shown_tabs,
    start_streamlit,
    stop,
    wait_healthy,
    wait_idle,
)

CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot .main-svg'
ROOT = Path(__file__).resolve().parents[1]
# a small corpus run of the shipped model: every held-out source, 4 prompts each, r̄ steps
CORPUS_ARGS = ["--per-source", "4", "--max-tokens", "32", "--seeds", "0,1", "--num-steps", "32",
               "--analyses", "dynamics,lens,seeds"]  # fmt: skip
TABLE = '[data-testid="stDataFrame"]'
ROW_PICKED = 4  # the table row chosen in the Corpus tab (0 = the first data row)


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


def corpus_run(out: Path) -> Path:
    """A small corpus run of the shipped model in ``out``, made unless it is there already."""
    if not (out / "manifest.json").exists():
        cmd = [sys.executable, "-m", "workbench.corpus", "run", "--out", str(out), *CORPUS_ARGS]
        subprocess.run(cmd, cwd=ROOT, check=True)
    return out


def open_corpus(page, run_dir: Path) -> None:
    """Type ``run_dir`` into the Corpus tab, then choose one row of its token table (a click on
    the row's selection cell at the table's left edge)."""
    field = page.get_by_label("Corpus result directory", exact=True)
    field.fill(str(run_dir))
    field.press("Enter")
    wait_idle(page)
    table = page.locator(TABLE).first
    table.scroll_into_view_if_needed()
    box = table.bounding_box()
    row_height = 35  # glide-data-grid's default header and row height
    page.mouse.click(box["x"] + 14, box["y"] + row_height * (ROW_PICKED + 1.5))
    wait_idle(page)
    page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]')?.scrollTo(0, 0)")


def chosen_tabs(shown: list[str], wanted: str | None) -> list:
    """The tab records (``apps.views.TABS``) the page shows, those named in ``wanted`` (a
    comma-separated list of titles) when given; a name the page does not show stops the run."""
    names = [t.strip() for t in wanted.split(",")] if wanted else shown
    unknown = [n for n in names if n not in shown]
    if unknown:
        sys.exit(f"no tab {', '.join(map(repr, unknown))}; the page shows {', '.join(shown)}")
    return [tab for tab in shown_tabs() if tab.title in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/screens"))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", default="0, 1, 2")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--corpus", type=Path, help="a corpus result directory (default: made)")
    parser.add_argument("--tabs", help="comma-separated tab titles to shoot (default: all)")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: run `make browser` (sh .ci/ensure_chromium.sh) first")
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = args.out / "streamlit.log"
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
            tabs = chosen_tabs(page.get_by_role("tab").all_inner_texts(), args.tabs)
            corpus = lambda: (args.corpus or corpus_run(args.out / "corpus")).resolve()  # noqa: E731
            prepare = {"Corpus": lambda pg: open_corpus(pg, corpus())}  # made only when shot
            shots = screenshot_tabs(page, args.out, tabs, prepare=prepare)
            browser.close()
    finally:
        stop(server)
    for title, path in shots.items():
        print(f"{title:20s} {path}")


if __name__ == "__main__":
    main()
