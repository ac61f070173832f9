"""App responsiveness on the default checkpoint (or the labelled random stand-in while it is missing).

1. AppTest (the script as Streamlit runs it, no browser): the first run in a fresh process (imports,
   model load, collection, PCA, the first charts); a redraw after changing only a view widget (the
   waterfall plane) and after switching tabs and back; and a rerun after changing the step count.
2. A real browser (Debian's Chromium via Playwright, when /usr/bin/chromium exists): time until the
   first plotly chart is drawn, after a tab switch (to Convergence and back) until its chart is drawn,
   and after changing the step count until the chart is redrawn with the new number of points.

Usage: python bench/bench_app.py [--repeats 3] [--skip-browser] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from apps.serve import APP as APP_PATH
from apps.serve import CHROMIUM, CHROMIUM_ARGS, free_port, start_streamlit, stop, wait_healthy

APP = str(APP_PATH)
CHART = '[data-testid="stPlotlyChart"] .js-plotly-plot'
POINTS = (
    "([sel, n]) => { const t = document.querySelector(sel)?.querySelector('.scatterlayer .trace');"
    " return t && t.querySelectorAll('.points path').length === n; }"
)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_apptest(repeats: int, checkpoint: str | None = None) -> dict[str, float | str]:
    from streamlit.testing.v1 import AppTest

    def check(at: AppTest) -> AppTest:
        if at.exception or at.error:
            raise RuntimeError(f"the app failed: {at.exception or [e.value for e in at.error]}")
        return at

    at = AppTest.from_file(APP, default_timeout=600)
    if checkpoint is not None:
        at.session_state["checkpoint"] = checkpoint
    first = timed(lambda: check(at.run()))
    out: dict[str, float | str] = {
        "model": "random stand-in" if at.warning else checkpoint or "checkpoints/default",
        "tokens × steps × seeds": at.caption[-1].value,
        "first run (cold process) s": first,
    }
    planes = ["PC3 / PC4", "PC1 / PC2"]
    view = [
        timed(lambda p=p: check(at.selectbox(key="waterfall_pair").set_value(p).run()))
        for p in planes * repeats
    ]
    out["view widget change s (median)"] = statistics.median(view)
    at.session_state["view"] = "Convergence"
    out["first Convergence tab s"] = timed(lambda: check(at.run()))
    tabs = []
    for _ in range(repeats):
        for name in ("Trajectories", "Convergence"):
            at.session_state["view"] = name
            tabs.append(timed(lambda: check(at.run())))
    out["tab switch, cached s (median)"] = statistics.median(tabs)
    at.session_state["view"] = "Trajectories"
    check(at.run())
    steps = at.number_input(key="steps").value
    new = [int(steps) - 1 - k for k in range(repeats)]
    times = [timed(lambda n=n: check(at.number_input(key="steps").set_value(n).run())) for n in new]
    out["step count change s (median)"] = statistics.median(times)
    return out


def bench_browser() -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    port = free_port()
    server = start_streamlit(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, timeout=600)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector(f"{CHART} .main-svg .scatterlayer", timeout=600_000)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            page.get_by_role("tab", name="Convergence").click()
            page.wait_for_selector(f"{CHART} .heatmaplayer", timeout=600_000)
            to_convergence = time.perf_counter() - t0
            t0 = time.perf_counter()
            page.get_by_role("tab", name="Trajectories").click()
            page.wait_for_selector(f"{CHART} .main-svg .scatterlayer", timeout=600_000)
            back = time.perf_counter() - t0
            steps = page.get_by_label("Steps", exact=True)
            current = int(steps.input_value())
            t0 = time.perf_counter()
            steps.fill(str(current - 4))
            steps.press("Enter")
            page.wait_for_function(POINTS, arg=[CHART, current - 3], timeout=600_000)
            redraw = time.perf_counter() - t0
            browser.close()
    finally:
        stop(server)
    return {
        "browser: first chart drawn s": first,
        "browser: tab switch to Convergence, heatmap drawn s": to_convergence,
        "browser: tab switch back, chart drawn s": back,
        "browser: redraw after step change s": redraw,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument(
        "--checkpoint", help="AppTest part on this directory (the browser part uses the default)"
    )
    args = parser.parse_args()
    results: dict[str, float | str] = bench_apptest(args.repeats, args.checkpoint)
    if not args.skip_browser and CHROMIUM.exists():
        results |= bench_browser()
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}
    print(json.dumps(rounded, indent=2))


if __name__ == "__main__":
    main()
