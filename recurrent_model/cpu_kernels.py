"""Process settings for the CPU kernels, made when ``recurrent_model`` is imported; a value the user
set is kept.

- Products with the same bits on any number of threads. MKL, which torch's float32 CPU products
  call, splits a small product's inner dimension between threads, so a (11, 192) × (192, 4096)
  product rounds differently on one thread than on two: a corpus run on one process (every core) and
  on N ranks (fewer threads each) would disagree in the last bits, and a notebook in a
  single-threaded kernel would disagree with the same call in a script. MKL's conditional numerical
  reproducibility in strict mode (``MKL_CBWR=AUTO,STRICT``) fixes the order of every product's sums
  whatever the thread count. MKL reads it at its first product. Products outside MKL (oneDNN's bf16
  kernels, GPU libraries) are not covered.
- One inductor cache per ATen CPU path. ``ATEN_CPU_CAPABILITY`` (e.g. ``avx2``, the way to run
  another CPU's kernel path on this one) changes the vector code inductor generates, but not the key
  of its graph cache: a graph compiled under the native path and reloaded under ``avx2`` computed
  wrong products (torch 2.13). So a process with the variable set compiles into a cache directory of
  its own, ``<the default>/aten-<capability>``. Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` at each
  cache access, and writes its default there when ``torch._inductor`` is imported: that value is
  inductor's, not the user's, and is replaced too. The project's own compiled graphs also carry the
  ISA in their options (:mod:`.inductor_isa`), which keeps them apart in any one directory.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import MutableMapping

THREAD_INDEPENDENT_MODE = "AUTO,STRICT"


def request_thread_independent_products(environ: MutableMapping[str, str] | None = None) -> str:
    """Ask MKL for strict reproducibility unless ``MKL_CBWR`` is already set; returns the mode in
    force. Takes effect only before the process's first MKL product."""
    environ = os.environ if environ is None else environ
    return environ.setdefault("MKL_CBWR", THREAD_INDEPENDENT_MODE)


def separate_inductor_cache(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Point inductor at a cache directory of the ATen CPU capability in force when
    ``ATEN_CPU_CAPABILITY`` is set and ``TORCHINDUCTOR_CACHE_DIR`` is unset or inductor's default
    (which importing ``torch._inductor`` writes there); returns the directory set, or None (the
    default cache serves the native path, a directory the user chose is kept)."""
    environ = os.environ if environ is None else environ
    capability = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    base = os.path.abspath(os.path.join(tempfile.gettempdir(), f"torchinductor_{_user()}"))
    chosen = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not capability or (chosen is not None and os.path.abspath(chosen) != base):
        return None
    environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"aten-{capability}")
    return environ["TORCHINDUCTOR_CACHE_DIR"]


def _user() -> str:
    """The user name inductor's default cache directory is named after (as inductor writes it)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no USER: inductor names it by uid too
        name = f"uid_{os.getuid()}"
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def configure(environ: MutableMapping[str, str] | None = None) -> None:
    """Both settings above, for this process (and the processes it starts)."""
    request_thread_independent_products(environ)
    separate_inductor_cache(environ)
