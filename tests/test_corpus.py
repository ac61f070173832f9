"""The corpus engine: batched runs equal one prompt at a time bit for bit, rows equal collect +
classify_dynamics, resume verifies parts and refuses other settings, bad input gets one line,
and a killed multi-rank run relaunched on other rank counts does every unit exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import REPO

import workbench as wb
from workbench import corpus
from workbench.collect import initial_states, run_states
from workbench.corpus.analyses import Settings, lens_columns, normalise, steps_to_converge
from workbench.corpus.engine import Job

PROMPTS = [
    "Claire makes a 3 egg omelet every morning.",
    "def f(x): return x + 1",
    "12 + 7 = 19",
    "The cat sat on the mat today",
    "x = 3; y = x * 2",
    "How many dozens of eggs will she eat in 4 weeks?",
    "a b c",
]
STEPS = 16


def write_prompts(path: Path, prompts: list[str] = PROMPTS) -> Path:
    path.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    return path


def job(data: Path, seeds=(0, 1), analyses=("dynamics", "lens", "seeds"), **kw) -> Job:
    settings = Settings(STEPS, tuple(seeds), tuple(analyses), (1, 8) if "lens" in analyses else ())
    return Job(str(data), settings, **{"unit_tokens": 24, **kw})


def test_batched_states_equal_one_prompt_at_a_time(shipped_model):
    tok = shipped_model.tokenizer
    prompts = [torch.tensor(tok.encode(t)) for t in PROMPTS[1:4]]  # 10 to 12 tokens: one width
    h = shipped_model.config.n_embd
    init = [initial_states(shipped_model, [(3, 1.0)], (len(p), h))[0] for p in prompts]
    batched = run_states(shipped_model, prompts, init, STEPS)
    for row, ids in enumerate(prompts):
        alone = wb.collect(shipped_model, ids, STEPS, seeds=[3], progress=False, normalized=False)
        np.testing.assert_array_equal(batched[:, row, : len(ids)].numpy(), alone.raw_states[0])


def test_blocked_arithmetic_is_the_same_bits_in_any_block(shipped_model):
    """The engine works through a batch in cache-sized blocks (steps for the norm, positions for
    the relative steps, rows for the lens softmax); every block size gives the same bits, and the
    relative steps are the app's convergence frame's."""
    prompts = [torch.tensor(shipped_model.tokenizer.encode(t)) for t in PROMPTS[1:4]]
    raw = run_states(shipped_model, prompts, None, STEPS)
    valid = torch.arange(raw.shape[2]) < torch.tensor([len(p) for p in prompts])[:, None]
    norm = shipped_model.state_norm()
    whole = torch.nn.functional.rms_norm(raw[:, valid], norm.weight.shape, norm.weight, norm.eps)
    states = normalise(shipped_model, raw, valid)
    assert torch.equal(states, whole)
    one, many = (lens_columns(shipped_model, raw, valid, (1, 8), rows=n) for n in (3, 10**6))
    assert all(torch.equal(one[name], many[name]) for name in one)
    z = states.numpy()
    blocks = [wb.relative_step_sizes(z, chunk=n) for n in (1, 5, 10**6)]
    assert all(np.array_equal(b, blocks[0], equal_nan=True) for b in blocks)
    frame = wb.convergence(z[:, : len(prompts[0])])
    app = frame.pivot(index="step", columns="position", values="relative_step").to_numpy()[1:]
    np.testing.assert_array_equal(app, blocks[0][:, : len(prompts[0])])


def test_rows_equal_collect_and_classify(shipped_model, tmp_path):
    out = corpus.run(
        shipped_model, job(write_prompts(tmp_path / "p.txt")), tmp_path / "run", progress=False
    )
    frame = corpus.load(out)
    assert len(frame) == 2 * sum(len(shipped_model.tokenizer.encode(t)) for t in PROMPTS)
    assert frame["prompt_id"].nunique() == len(PROMPTS) and set(frame["source"]) == {"p"}
    for text in PROMPTS[1:3]:
        ids = shipped_model.tokenizer.encode(text)
        for seed in (0, 1):
            traj = wb.collect(shipped_model, ids, STEPS, seeds=[seed], progress=False)
            ref = wb.classify_dynamics(traj.states[0], tokens=traj.tokens)
            rows = frame[
                (frame["prompt_id"] == corpus.prompt_id("p", text)) & (frame["seed"] == seed)
            ]
            for column in ("token", "kind", "period", "flip", "settled", "final_step_size"):
                pd.testing.assert_series_equal(
                    rows[column].reset_index(drop=True), ref[column].reset_index(drop=True),
                    check_names=False, check_dtype=False,
                )  # fmt: skip
            stc = wb.steps_to_converge(wb.convergence(traj.states[0]))["steps_to_converge"]
            np.testing.assert_array_equal(rows["steps_to_converge"], stc.astype(float).to_numpy())
    assert {"lens_kl_1", "lens_entropy_8", "seed_spread", "seed_kinds_agree"} <= set(frame.columns)
    assert (frame["lens_kl_1"] >= 0).all() and frame["seed_spread"].notna().all()
    tables = corpus.summary(out)
    assert tables["overall"]["tokens"].iloc[0] == len(frame)
    assert (out / "summary.md").read_text().startswith("Corpus run of small")
    json.loads((out / "summary.json").read_text())  # valid JSON: no NaN literals


def test_steps_to_converge_semantics():
    z = np.ones((6, 1, 2))
    z[:3, 0, 0] = [5.0, 3.0, 2.0]  # the last move is into step 3: settled from step 4
    assert steps_to_converge(z, 1e-2)[0] == 4
    z[5, 0, 0] = 9.0  # moves at the last step: never converged
    assert np.isnan(steps_to_converge(z, 1e-2)[0])


def test_relaunch_verifies_parts_and_refuses_other_settings(shipped_model, tmp_path, capsys):
    data = write_prompts(tmp_path / "p.txt", PROMPTS[:4])
    out = tmp_path / "run"
    corpus.run(shipped_model, job(data, seeds=(0,), analyses=("dynamics",)), out, progress=False)
    parts = sorted((out / "tokens").glob("part-*.parquet"))
    assert len(parts) >= 2
    stamps = {p.name: p.stat().st_mtime_ns for p in parts}
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # a torn part
    corpus.run(shipped_model, job(data, seeds=(0,), analyses=("dynamics",)), out, progress=False)
    err = capsys.readouterr().err
    assert f"part {parts[0].name} failed verification (unreadable)" in err
    assert (out / "rejected" / parts[0].name).exists()
    assert all(p.stat().st_mtime_ns == stamps[p.name] for p in parts[1:])  # not redone
    with pytest.raises(
        corpus.CorpusError, match=r"other settings \(settings.seeds: \[0\] → \[0, 1\]"
    ):
        corpus.run(
            shipped_model, job(data, seeds=(0, 1), analyses=("dynamics",)), out, progress=False
        )
    write_prompts(data, PROMPTS[:3] + ["a changed prompt"])
    with pytest.raises(corpus.CorpusError, match="data.fingerprint"):
        corpus.run(
            shipped_model, job(data, seeds=(0,), analyses=("dynamics",)), out, progress=False
        )


def test_a_failing_unit_stops_with_one_line_and_leaves_no_part(shipped_model, tmp_path):
    calls = {"n": 0}

    def fail_on_second_batch(x, hook):
        calls["n"] += hook.step == 0
        if calls["n"] == 2:
            raise RuntimeError("injected fault")

    data = write_prompts(tmp_path / "p.txt", PROMPTS[:4])
    with shipped_model.hooks([("core.hook_state", fail_on_second_batch)]):
        with pytest.raises(
            corpus.CorpusError,
            match=r"rank 0: unit \d+ \(\d+ prompts, first [0-9a-f]{16}\) failed: RuntimeError: injected fault",
        ):
            corpus.run(
                shipped_model,
                job(data, seeds=(0,), analyses=("dynamics",)),
                tmp_path / "run",
                progress=False,
            )
    parts = list((tmp_path / "run" / "tokens").glob("*"))
    assert len(parts) == 1 and parts[0].name == "part-00000.parquet"  # no partial part


@pytest.mark.parametrize(
    ("content", "column", "message"),
    [
        ("", None, "no prompts"),
        ('{"q": "hi"}\n', None, "name the text column with --column"),
        ('{"q": "hi"}\n', "text", "no column 'text'"),
        ("x" * 3000, None, "more than the model's context of 256: cut prompts with --max-tokens"),
    ],
)
def test_bad_input_is_one_line(shipped_model, tmp_path, content, column, message):
    suffix = ".jsonl" if content.startswith("{") else ".txt"
    data = tmp_path / f"in{suffix}"
    data.write_text(content)
    with pytest.raises(corpus.CorpusError, match=message):
        corpus.run(shipped_model, job(data, column=column), tmp_path / "run", progress=False)


def test_unknown_dataset_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(corpus.CorpusError, match="not a dataset in the local cache"):
        corpus.read_prompts("no-such-org/no-such-dataset", column="text")


def _cli(out: Path, data: Path, nproc: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "workbench.corpus", "run", "--data", str(data), "--out", str(out),
            "--num-steps", "8", "--unit-tokens", "8", "--nproc", str(nproc), *extra]  # fmt: skip


@pytest.mark.slow
def test_every_column_is_the_same_bits_on_one_process_and_two_ranks(tmp_path):
    """Dynamics, lens, seeds and stability: one process on two threads and two ranks on one thread
    each write equal rows (an 11-token prompt's lens product is one MKL splits between threads)."""
    data = write_prompts(tmp_path / "p.txt")
    extra = ("--analyses", "dynamics,lens,seeds,stability", "--seeds", "0,1", "--lens-steps", "1,4")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_CBWR")}
    frames = []
    for nproc, threads in ((1, "2"), (2, "1")):
        out = tmp_path / f"ranks-{nproc}"
        run_env = {**env, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(REPO)}
        assert subprocess.run(_cli(out, data, nproc, *extra), cwd=REPO, env=run_env).returncode == 0
        frame = corpus.load(out).sort_values(["prompt_id", "seed", "position"])
        frames.append(frame.reset_index(drop=True))
    assert {"lens_kl_1", "lens_entropy_4", "seed_spread", "lambda_1"} <= set(frames[0].columns)
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)


@pytest.mark.slow
def test_killed_run_relaunched_on_other_rank_counts_does_each_unit_once(tmp_path):
    """2 ranks, kill -9 one as soon as a part exists, relaunch on 3 ranks and then 1; the union
    equals a single-process run bit for bit, and no finished part was written twice."""
    data = write_prompts(tmp_path / "p.txt", PROMPTS * 2 + [p + " again" for p in PROMPTS])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = tmp_path / "ranks"
    launcher = subprocess.Popen(_cli(out, data, 2), cwd=REPO, env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not list((out / "tokens").glob("part-*.parquet")) and time.time() < deadline:
        time.sleep(0.02)
    import psutil

    ranks = [p for p in psutil.Process(launcher.pid).children(recursive=True) if "workbench.corpus" in " ".join(p.cmdline()) and "torch.distributed.run" not in " ".join(p.cmdline())]  # fmt: skip
    assert ranks, "no rank process to kill"
    os.kill(ranks[-1].pid, signal.SIGKILL)
    assert launcher.wait(timeout=120) != 0
    first = {p.name: p.stat().st_mtime_ns for p in (out / "tokens").glob("part-*.parquet")}
    total = len(
        json.loads((out / "manifest.json").read_text())
        and pd.read_parquet(out / "prompts.parquet")["unit"].unique()
    )
    assert 0 < len(first) < total, "the kill landed after the run had finished"
    assert subprocess.run(_cli(out, data, 3), cwd=REPO, env=env).returncode == 0
    assert subprocess.run(_cli(out, data, 1), cwd=REPO, env=env).returncode == 0
    parts = {p.name: p.stat().st_mtime_ns for p in (out / "tokens").glob("part-*.parquet")}
    assert len(parts) == total and all(parts[name] == stamp for name, stamp in first.items())
    single = tmp_path / "single"
    assert subprocess.run(_cli(single, data, 1), cwd=REPO, env=env).returncode == 0
    a = corpus.load(out).sort_values(["prompt_id", "seed", "position"]).reset_index(drop=True)
    b = corpus.load(single).sort_values(["prompt_id", "seed", "position"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
