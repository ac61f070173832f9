"""Run an app action as a Streamlit script and press Stop on it the way the browser's button does.

The action runs in AppTest's script runner (its own thread); once it is running, Stop is requested
on that runner (``ScriptRunner.request_stop``, what the Stop button sends), and the script thread
is joined. Shared by tests/test_app_stop.py (a tiny slowed model, a bound asserted) and
bench/bench_app_stop.py (the Huginn-0125 shape, latency and CPU measured).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from streamlit.testing.v1 import AppTest
from streamlit.testing.v1 import app_test as app_test_module

SCRIPT = f"import sys\nsys.modules[{__name__!r}].TASK[0]()\n"
TASK: dict[int, Callable[[], None]] = {}


class Recording(app_test_module.LocalScriptRunner):
    """AppTest's script runner, remembered so that Stop can be pressed on it."""

    made: list[app_test_module.LocalScriptRunner] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Recording.made.append(self)


@dataclass
class Stopped:
    """What happened to an action Stop was pressed on."""

    took: float  # seconds from Stop to the end of the script thread (or to giving up on it)
    ended: bool  # the script thread ended
    finished: bool  # the action ran to its end (before or despite Stop)
    started: bool  # ``running()`` came true before the action finished
    pressed: float  # time.monotonic() when Stop was pressed
    error: Exception | None = None  # what the action raised (Stop itself raises no Exception)


def run_then_stop(
    task: Callable[[], None],
    running: Callable[[], bool],
    *,
    settle: float = 0.0,
    start_timeout: float = 60.0,
    join_timeout: float = 30.0,
    on_stop: Callable[[], None] | None = None,
) -> Stopped:
    """Run ``task`` as a script; ``settle`` seconds after ``running()`` is first true, press Stop
    (calling ``on_stop`` just before) and wait up to ``join_timeout`` s for the script thread."""
    finished: list[bool] = []
    errors: list[Exception] = []

    def script() -> None:
        try:
            task()
        except Exception as error:
            errors.append(error)
            raise
        finished.append(True)

    made = app_test_module.LocalScriptRunner
    app_test_module.LocalScriptRunner = Recording
    Recording.made.clear()
    TASK[0] = script
    try:
        at = AppTest.from_string(SCRIPT, default_timeout=max(120.0, join_timeout + settle + 60))
        driver = threading.Thread(target=at.run, daemon=True)
        driver.start()
        deadline = time.monotonic() + start_timeout
        while not running() and time.monotonic() < deadline and not finished:
            time.sleep(0.005)
        started = running() and not finished and not errors
        if started and settle > 0:
            time.sleep(settle)
        runner = Recording.made[-1]
        if on_stop is not None:
            on_stop()
        pressed = time.monotonic()
        runner.request_stop()
        runner._script_thread.join(timeout=join_timeout)
        took = time.monotonic() - pressed
        ended = not runner._script_thread.is_alive()
        if ended:
            driver.join(timeout=30)
        return Stopped(took, ended, bool(finished), started, pressed, errors[0] if errors else None)
    finally:
        app_test_module.LocalScriptRunner = made
        TASK.pop(0, None)
