"""Helpers shared by the test modules (fixtures shared by them live in conftest.py)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = (
    "the model iterates its core block on a latent state while every token reads the "
    "prelude output and the coda decodes numbers 12 345 and 6789 plus def return if else "
    "sum product answer question step first then finally"
).split()


def run_launch(*args: str) -> tuple[int, str, str]:
    """``pretrain/launch.py`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from pretrain.launch import main as launch_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = launch_main(list(args))
    return code, out.getvalue(), err.getvalue()


def losses(run: Path) -> list[float]:
    """The loss of every step a run's metrics.jsonl records, in order."""
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def write_corpus(directory: Path, docs: int = 160) -> None:
    """``docs`` text files of 50 to 90 words from ``WORDS`` (the same for every call)."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(docs):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 90)))
        (directory / f"doc{i:03d}.txt").write_text(text + "\n", encoding="utf-8")


def write_config(path: Path, corpus: Path, cache: Path, **train: object) -> Path:
    """A training config of a 32-wide tiny model on ``corpus`` (CPU, fp32, one thread); ``train``
    overrides keys of its train section."""
    settings = dict(
        max_steps=8,
        micro_batch_size=2,
        lr=3.0e-3,
        warmup_steps=2,
        cooldown_steps=2,
        checkpoint_every=4,
        keep_last=2,
        log_every=1,
        health_every=4,
        val_every=4,
        val_batches=2,
        progress=False,
        threads=1,
        device="cpu",
        precision="fp32",
    )
    settings.update(train)
    config = {
        "model": {
            "preset": "tiny",
            "overrides": {
                "n_embd": 32,
                "n_heads": 2,
                "intermediate_size": 64,
                "mean_recurrence": 4,
                "mean_backprop_depth": 2,
            },
        },
        "data": {
            "sources": [str(corpus)],
            "vocab_size": 320,
            "block_size": 32,
            "val_fraction": 0.1,
            "cache_dir": str(cache),
        },
        "train": settings,
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def tree_digest(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under ``directory``, by relative path (to show nothing was written)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def launch(
    root: Path,
    config: Path,
    out: Path,
    nproc: int,
    *overrides: str,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> subprocess.Popen | None:
    """``pretrain/launch.py`` on ``nproc`` local ranks training ``config`` into ``out``, with every
    rank's checkpoint report (``rank_callbacks:checkpoint_report``); ``overrides`` are ``--set``
    values. Waits and asserts success, or returns the running process (its own session) when
    ``wait`` is false."""
    out.mkdir(parents=True, exist_ok=True)
    full_env = dict(
        os.environ,
        PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}",
        DCP_TEST_OUT=str(out),
        PRETRAIN_PEAK_FLOPS="1e11",
        **(env or {}),
    )
    cmd = [sys.executable, "pretrain/launch.py", "--config", str(config), "--out", str(out)]
    cmd += ["--nproc", str(nproc), "--callback", "rank_callbacks:checkpoint_report", *extra]
    for o in overrides:
        cmd += ["--set", o]
    if not wait:
        return subprocess.Popen(
            cmd,
            env=full_env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    proc = subprocess.run(cmd, env=full_env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return None


def relative_error(a, b) -> float:
    """max |a − b| / max |b| of two tensors: an error relative to the reference's scale."""
    return float((a.detach().float() - b.float()).abs().max() / b.float().abs().max())


def compiled_with_code(function, options: dict, inputs: tuple, threads: int | None = None):
    """``function(*inputs)`` through a fresh ``torch.compile`` with inductor ``options`` and no graph
    cache (``threads``: inductor's ``cpp.threads``): (output, the generated code as one string)."""
    import torch
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(function, fullgraph=True, options=options)
    patches = {"fx_graph_cache": False, **({"cpp.threads": threads} if threads else {})}
    with config.patch(patches):
        out, codes = run_and_get_code(compiled, *inputs)
    return out, "\n".join(codes)
