"""CPU matrix products with the same bits on any number of threads.

MKL, which torch's float32 CPU products call, splits a small product's inner dimension between
threads, so a (11, 192) × (192, 4096) product rounds differently on one thread than on two. Then a
corpus run on one process (every core) and on N ranks (fewer threads each) would disagree in the
last bits, and a notebook in a single-threaded kernel would disagree with the same call in a
script. MKL's conditional numerical reproducibility in strict mode (``MKL_CBWR=AUTO,STRICT``) fixes
the order of every product's sums whatever the thread count; MKL reads the variable at its first
product, so it is set when ``recurrent_model`` is imported. A value the user set is kept.
Products outside MKL (oneDNN's bf16 kernels, GPU libraries) are not covered.
"""

from __future__ import annotations

import os

THREAD_INDEPENDENT_MODE = "AUTO,STRICT"


def request_thread_independent_products(environ: dict[str, str] | None = None) -> str:
    """Ask MKL for strict reproducibility unless ``MKL_CBWR`` is already set; returns the mode in
    force. Takes effect only before the process's first MKL product."""
    environ = os.environ if environ is None else environ
    return environ.setdefault("MKL_CBWR", THREAD_INDEPENDENT_MODE)
