"""Serve the app with `streamlit run` on a free localhost port and open it in Debian's Chromium.

Shared by the browser end-to-end test and the app benchmark.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

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
