"""The fault table of docs/pretraining.md, one test per row: corrupt, missing and truncated
checkpoint files, a missing optimizer state, non-finite weights and losses, loss spikes, changed
data and shape, a second launch into a run's directory, torn and damaged metrics, SIGTERM to the
local launcher, and a write failure on one rank. Each fault is recovered and said in one line,
refused in one line, or stopped with a named error and nothing published."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, launch, run_launch, tree_digest, write_config, write_corpus
from safetensors.torch import load_file

import recurrent_model
from pretrain import checkpointing as ck

STEPS = ("step-0000002", "step-0000004")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4, launched over a stale lock file."""
    root = tmp_path_factory.mktemp("faults")
    write_corpus(root / "corpus", docs=60)
    config = write_config(
        root / "tiny.yaml",
        root / "corpus",
        root / "data",
        max_steps=4,
        micro_batch_size=1,
        checkpoint_every=2,
        keep_last=5,
        health_every=100,
        val_every=100,
        val_batches=1,
        warmup_steps=1,
        tensorboard=False,
    )
    run = root / "run"
    run.mkdir()
    stale = {"host": "node-gone", "pid": 999999, "started": 1.0}
    (run / ".run.lock").write_text(json.dumps(stale))
    code, out, err = run_launch("--config", str(config), "--out", str(run))
    assert code == 0, out + err
    return root, config, run, out


def copy_run(base, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base[2], run)
    return run


def resume(base, run: Path, *extra: str) -> tuple[int, str, str]:
    return run_launch("--config", str(base[1]), "--out", str(run), "--resume", *extra)


def strict_json(line: str) -> dict:
    """``json.loads`` that refuses NaN and Infinity (they are not JSON)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def metrics(run: Path) -> list[dict]:
    return [strict_json(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def one_file(checkpoint: Path, pattern: str) -> Path:
    [path] = checkpoint.glob(pattern)
    return path


# Checkpoint integrity ---------------------------------------------------------------------------
def test_corrupted_model_shard_falls_back_and_is_kept(base, tmp_path):
    run = copy_run(base, tmp_path)
    shard = one_file(run / "checkpoints" / STEPS[1], "shards/*-00001-of-*.safetensors")
    data = bytearray(shard.read_bytes())
    data[-8:] = struct.pack("<ff", float("inf"), float("inf"))
    shard.write_bytes(bytes(data))
    code, out, err = resume(base, run, "--max-steps", "4")
    assert code == 0, out + err
    name = shard.relative_to(shard.parent.parent).as_posix()
    assert f"step-0000004 fails verification: {name} (model shard) is corrupted" in out
    assert "fell back to step-0000002, the newest checkpoint that verifies" in out
    [kept] = [p for p in (run / "checkpoints" / ck.REJECTED_DIR).iterdir() if p.is_dir()]
    assert (kept / name).read_bytes() == bytes(data)  # the bad one, untouched
    latest = run / "checkpoints" / STEPS[1]  # trained again from step 2
    assert (run / "checkpoints" / ck.LATEST).read_text().strip() == STEPS[1]
    weights = load_file(latest / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    summary = strict_json(out.strip().splitlines()[-1])
    assert summary["step"] == 4


@pytest.mark.parametrize(
    ("pattern", "fault", "part", "said"),
    [
        ("shards/*-00001-of-*.safetensors", "truncate", "model shard", "is truncated"),
        ("shards/*-00002-of-*.safetensors", "delete", "optimizer shard", "is missing"),
        ("ranks/rank-000000.json", "corrupt", "rank state", "is corrupted"),
        ("tokenizer.json", "corrupt", "tokenizer", "is corrupted"),
        ("config.json", "delete", "config", "is missing"),
    ],
)
def test_a_bad_file_in_any_part_is_named_and_resume_falls_back(
    base, tmp_path, pattern, fault, part, said
):
    run = copy_run(base, tmp_path)
    path = one_file(run / "checkpoints" / STEPS[1], pattern)
    if fault == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif fault == "delete":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    code, out, err = resume(base, run, "--max-steps", "2")  # step 2 is the stop step
    assert code == 0, out + err
    name = path.relative_to(run / "checkpoints" / STEPS[1]).as_posix()
    assert f"step-0000004 fails verification: {name} ({part}) {said}" in out
    assert "fell back to step-0000002" in out and "nothing to train" in out
    assert len(list((run / "checkpoints" / ck.REJECTED_DIR).glob("step-0000004.*.why.txt"))) == 1


def test_the_plan_shows_the_checksum_cost(base):
    code, out, err = run_launch("--config", str(base[1]), "--plan")
    assert code == 0, out + err
    [row] = [line for line in out.splitlines() if "checksums per checkpoint" in line]
    assert " s per rank" in row and "while writing" in row and "a resume verifies" in row


def test_latest_naming_a_deleted_step_falls_back(base, tmp_path):
    run = copy_run(base, tmp_path)
    (run / "checkpoints" / ck.LATEST).write_text("step-0000009\n")
    code, out, err = resume(base, run, "--max-steps", "4")
    assert code == 0, out + err
    assert "latest names 'step-0000009', which is not a complete checkpoint" in out
    assert "fell back to step-0000004" in out
    assert (run / "checkpoints" / ck.LATEST).read_text().strip() == STEPS[1]


def test_missing_optimizer_state_is_refused_unless_reset_optimizer(base, tmp_path):
    run = copy_run(base, tmp_path)
    for step in STEPS:
        one_file(run / "checkpoints" / step, "shards/*-00002-of-*.safetensors").unlink()
    before = tree_digest(run)
    code, out, err = resume(base, run, "--max-steps", "4")
    assert code == 2 and err.count("\n") == 1, out + err
    assert "no checkpoint in" in err and "(optimizer shard) is missing" in err
    assert "--reset-optimizer" in err
    assert tree_digest(run) == before
    code, out, err = resume(base, run, "--max-steps", "4", "--reset-optimizer")
    assert code == 0, out + err
    assert "step-0000004's optimizer state is not read; it starts fresh" in out


def test_missing_optimizer_state_without_a_manifest_is_refused(base, tmp_path):
    """A checkpoint written without a manifest (older ones) is still checked for its optimizer
    state: the moments are never reset silently."""
    run = copy_run(base, tmp_path)
    for step in STEPS:
        checkpoint = run / "checkpoints" / step
        (checkpoint / "manifest.json").unlink()
        state = json.loads((checkpoint / ck.STATE_JSON).read_text())
        del state["manifest"]
        (checkpoint / ck.STATE_JSON).write_text(json.dumps(state))
        one_file(checkpoint, "shards/*-00002-of-*.safetensors").unlink()
    code, out, err = resume(base, run, "--max-steps", "4")
    assert code == 2 and err.count("\n") == 1, out + err
    assert "its optimizer state is missing (0 of " in err and "--reset-optimizer" in err


def test_non_finite_weights_in_a_checkpoint_without_a_manifest_fall_back(base, tmp_path):
    """A checkpoint whose files cannot be checked (no manifest) but whose weights hold inf is
    refused once loaded, and the resume falls back."""
    run = copy_run(base, tmp_path)
    checkpoint = run / "checkpoints" / STEPS[1]
    (checkpoint / "manifest.json").unlink()
    state = json.loads((checkpoint / ck.STATE_JSON).read_text())
    del state["manifest"]
    (checkpoint / ck.STATE_JSON).write_text(json.dumps(state))
    shard = one_file(checkpoint, "shards/*-00001-of-*.safetensors")
    data = bytearray(shard.read_bytes())
    data[-8:] = struct.pack("<ff", float("inf"), float("inf"))
    shard.write_bytes(bytes(data))
    code, out, err = resume(base, run, "--max-steps", "2")
    assert code == 0, out + err
    assert "step-0000004 fails verification: its weights hold non-finite values (" in out
    assert "fell back to step-0000002" in out


# Nothing non-finite is published ----------------------------------------------------------------
def poison_weights_after_step(monkeypatch, step: int) -> None:
    import pretrain.trainer as tr

    original = tr.Trainer.train_step

    def poisoned(self):
        if self.step == step:
            with torch.no_grad():
                self.model.transformer.ln_f.weight.fill_(float("nan"))
        return original(self)

    monkeypatch.setattr(tr.Trainer, "train_step", poisoned)


@pytest.mark.parametrize("max_skipped", [0, 5])
def test_non_finite_steps_and_weights_are_never_published(base, tmp_path, monkeypatch, max_skipped):
    """NaN weights after step 2: with max_skipped_steps 0 the run stops at step 3 before the
    update; with 5 the updates of steps 3 and 4 are skipped and the step-4 checkpoint, whose
    weights are NaN, is not written. Either way latest stays on step 2 and the exit is 1."""
    poison_weights_after_step(monkeypatch, 2)
    run = tmp_path / "nan"
    code, out, err = run_launch(
        "--config",
        str(base[1]),
        "--out",
        str(run),
        "--set",
        f"train.max_skipped_steps={max_skipped}",
    )
    assert code == 1 and err.count("\n") == 1, out + err
    if max_skipped == 0:
        assert "step 3: loss nan, gradient norm nan: 1 non-finite step(s) in a row" in err
        assert [r["step"] for r in metrics(run)] == [1, 2]
    else:
        assert "checkpoint step 4 was not written: the weights hold non-finite values" in err
        assert "(rank 0: transformer.ln_f.weight); latest still names step-0000002" in err
    assert ck.CheckpointDirectory(run / "checkpoints").steps() == [2]
    assert (run / "checkpoints" / ck.LATEST).read_text().strip() == STEPS[0]


def scale_loss_at(monkeypatch, step: int, factor: float) -> None:
    """Multiply the training loss of step ``step`` (1-based) by ``factor``."""
    calls = []
    original = recurrent_model.RecurrentLM.forward

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.training and kwargs.get("labels") is not None:
            calls.append(1)
            if len(calls) == step:
                out.loss = out.loss * factor
        return out

    monkeypatch.setattr(recurrent_model.RecurrentLM, "forward", forward)


@pytest.mark.parametrize("action", ["warn", "stop"])
def test_loss_spike_warns_or_stops_before_the_update(base, tmp_path, monkeypatch, action):
    scale_loss_at(monkeypatch, 4, 50.0)
    run = tmp_path / "spike"
    spike = ["train.loss_spike_factor=3", "train.loss_spike_window=2"]
    args = ["--config", str(base[1]), "--out", str(run)]
    for setting in [*spike, f"train.loss_spike_action={action}"]:
        args += ["--set", setting]
    code, out, err = run_launch(*args)
    if action == "warn":
        assert code == 0, out + err
        assert "step 4: loss spike: " in out and "above 3 x its running median" in out
        assert [r.get("loss_spike", False) for r in metrics(run)] == [False] * 3 + [True]
        strict_json(out.strip().splitlines()[-1])
    else:
        assert code == 1 and err.count("\n") == 1, out + err
        assert "step 4: loss " in err and "is above 3 x the running median" in err
        assert ck.CheckpointDirectory(run / "checkpoints").steps() == [2]


def test_summary_is_valid_json_when_the_last_loss_is_nan(base, tmp_path, monkeypatch):
    scale_loss_at(monkeypatch, 4, float("nan"))
    run = tmp_path / "nan-last"
    code, out, err = run_launch("--config", str(base[1]), "--out", str(run))
    assert code == 0, out + err
    summary = strict_json(out.strip().splitlines()[-1])
    assert summary["loss"] == "nan" and summary["skipped"] == 1
    assert metrics(run)[-1]["skipped"] is True


# Identity on resume -----------------------------------------------------------------------------
def test_changed_corpus_is_refused_unless_allow_data_change(base, tmp_path):
    root, config, _, _ = base
    corpus = tmp_path / "corpus"
    shutil.copytree(root / "corpus", corpus)
    doc = corpus / "doc000.txt"  # the same words in another order: the same rows, other text
    doc.write_text(" ".join(reversed(doc.read_text().split())) + "\n")
    run = copy_run(base, tmp_path)
    data = ["--set", f"data.sources=[{corpus}]", "--set", f"data.cache_dir={tmp_path / 'data'}"]
    before = tree_digest(run)
    code, out, err = resume(base, run, "--max-steps", "4", *data)
    assert code == 2 and err.count("\n") == 1, out + err
    assert "cannot resume from step-0000004: the corpus changed" in err
    assert "pass --allow-data-change" in err
    assert tree_digest(run) == before
    code, out, err = resume(base, run, "--max-steps", "4", *data, "--allow-data-change")
    assert code == 0, out + err
    assert "the corpus changed" in out and "training goes on from the start of the new data" in out


def test_changed_shape_is_refused_even_with_allow_data_change(base, tmp_path):
    run = copy_run(base, tmp_path)
    shape = ["--set", "model.overrides.n_embd=48", "--allow-data-change"]
    code, out, err = resume(base, run, "--max-steps", "6", *shape)
    assert code == 2 and err.count("\n") == 1, out + err
    assert "cannot resume from step-0000004: the model's shape differs" in err
    assert "n_embd 32 -> 48" in err


def test_config_changes_are_printed_and_recorded(base, tmp_path):
    run = copy_run(base, tmp_path)
    code, out, err = resume(
        base, run, "--max-steps", "5", "--set", "train.max_steps=5", "--set", "train.lr=0.001"
    )
    assert code == 0, out + err
    assert "the config differs from step-0000004's: train.lr: 0.003 -> 0.001" in out
    rows = metrics(run)
    assert rows[-1]["step"] == 5 and rows[-1]["config_changes"]["train.lr"] == [0.003, 0.001]
    info = json.loads((run / "run-resume-0000004.json").read_text())
    assert info["config_changes"]["train.max_steps"] == [4, 5]


# One run per directory --------------------------------------------------------------------------
def test_a_second_launch_is_refused_while_the_first_holds_the_directory(base, tmp_path):
    from pretrain.config import load_config
    from pretrain.launch import train
    from pretrain.run_lock import RunLock

    run = copy_run(base, tmp_path)
    holder = RunLock.acquire(run)  # the first run
    try:
        before = tree_digest(run)
        named = f"is in use by another run (pid {os.getpid()} on host {socket.gethostname()}"
        for launcher in ([], ["--nproc", "2"]):  # refused before torchrun starts any rank
            code, out, err = resume(base, run, *launcher)
            assert code == 2 and err.count("\n") == 1 and named in err, out + err
        err = io.StringIO()
        with contextlib.redirect_stderr(err):  # past the launcher's check: rank 0 refuses
            assert train(load_config(base[1]), run, resume=True) == 2
        assert named in err.getvalue()
        assert tree_digest(run) == before
    finally:
        holder.release()


def test_a_stale_lock_is_reported(base):
    out = base[3]
    assert "a stale lock of pid 999999 on host node-gone since" in out
    assert "was left by a run that ended without releasing it" in out


# Signals ----------------------------------------------------------------------------------------
def test_signal_handlers_off_the_main_thread_say_they_are_missing(base, tmp_path):
    results = []
    thread = threading.Thread(
        target=lambda: results.append(
            run_launch("--config", str(base[1]), "--out", str(tmp_path / "t"), "--max-steps", "1")
        )
    )
    thread.start()
    thread.join(120)
    [(code, out, err)] = results
    assert code == 0, out + err
    assert "cannot install its SIGTERM/SIGUSR1 handlers" in out


RANK_MODULE = """
import os, signal, sys, time
out = sys.argv[1]
rank = os.environ["RANK"]
def stop(signum, frame):
    open(os.path.join(out, "term" + rank), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
with open(os.path.join(out, "pid" + rank), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_sigterm_to_the_local_launcher_reaches_every_rank(tmp_path):
    (tmp_path / "fault_rank.py").write_text(RANK_MODULE)
    driver = (
        "import sys\nfrom cluster.torchrun import relaunch_with_torchrun\n"
        f"sys.exit(relaunch_with_torchrun(2, [{str(tmp_path)!r}], module='fault_rank'))\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, cwd=REPO)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"pid{r}").is_file() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.05)
        time.sleep(0.2)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert [(tmp_path / f"term{r}").exists() for r in (0, 1)] == [True, True]
        assert not any(alive(pid) for pid in pids)  # no rank outlives the launcher
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


# No hang on one rank's failure; two ranks ---------------------------------------------------------
def disk_full_on_rank_0() -> object:
    """A ``--callback`` for the ranks: rank 0's config.json write of step 4 fails (ENOSPC)."""
    import errno

    from pretrain.callbacks import TrainerCallback
    from recurrent_model import RecurrentConfig

    to_json = RecurrentConfig.to_json

    def failing(self: RecurrentConfig, path: Path) -> None:
        if os.environ.get("RANK") == "0" and ".step-0000004" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        to_json(self, path)

    RecurrentConfig.to_json = failing  # type: ignore[method-assign]
    return TrainerCallback()


@pytest.mark.slow
def test_disk_full_on_one_rank_stops_every_rank_with_one_named_error(base, tmp_path):
    """Rank 0's config.json write of step 4 fails: every rank stops with the same named error
    (no rank waits in a barrier), latest stays on step 2. Then, on the 2-rank checkpoint, rank
    1's optimizer shard goes missing: a resume names the file and refuses."""
    run = tmp_path / "two"
    injected = ("--callback", "test_train_faults:disk_full_on_rank_0")
    proc = launch(tmp_path, base[1], run, 2, "distributed.strategy=ddp", extra=injected, wait=False)
    assert proc is not None
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, output[-3000:]
    assert f'File "{REPO / "pretrain"}' not in output, output[-3000:]  # no rank's traceback
    said = "error: checkpoint step 4 was not published: the write failed (rank 0: OSError(28, "
    assert output.count(said) == 1, output[-3000:]
    assert "latest still names step-0000002" in output
    assert ck.CheckpointDirectory(run / "checkpoints").steps() == [2]
    shards = run / "checkpoints" / STEPS[0] / ck.SHARDS_DIR
    assert len(list(shards.glob("*-00002-of-*.safetensors"))) == 2
    one_file(shards, "shard-00002-*-00002-of-*.safetensors").unlink()
    code, out, err = resume(base, run)
    assert code == 2 and err.count("\n") == 1, out + err
    assert "shards/shard-00002-model-00002-of-00002.safetensors (optimizer shard) is missing" in err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_two_ranks(base, run: Path, *overrides: str) -> list[subprocess.Popen]:
    """Ranks 0 and 1 of a bucketed run (its all-reduces are Python calls a stack names), started
    without torchrun so that a test signals each; rank 1 stalls at the start of step 2
    (tests/hang_callbacks.py). Each rank's output goes to OUT/out<rank>.txt."""
    run.mkdir()
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE="2",
        PRETRAIN_PEAK_FLOPS="1e11",
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, "pretrain/launch.py", "--config", str(base[1]), "--out", str(run)]
    cmd += ["--callback", "hang_callbacks:stall_rank_1"]
    for o in ("distributed.strategy=bucketed", "distributed.timeout_minutes=1", *overrides):
        cmd += ["--set", o]
    return [
        subprocess.Popen(
            cmd,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            cwd=REPO,
            stdout=open(run / f"out{r}.txt", "w"),  # noqa: SIM115 - the child holds it
            stderr=subprocess.STDOUT,
        )
        for r in (0, 1)
    ]


def wait_for_step_2(run: Path, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 180
    while not all((run / f"step2-rank{r}").is_file() for r in (0, 1)):
        alive = all(p.poll() is None for p in procs)
        assert alive and time.monotonic() < deadline, (run / "out0.txt").read_text()[-3000:]
        time.sleep(0.05)


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_a_stalled_rank_makes_its_peer_stop_after_the_step_timeout(base, tmp_path):
    """The collective timeout is the start-up one (60 s) through step 1 and the step's (3 s) on
    every group after it. Rank 1 stalls at step 2: rank 0 stops with a named error in about the
    step timeout, each rank's stack dump names where it waited (rank 0: the all-reduce; rank 1:
    its stall), and rank 1 stops with a named error when it finds rank 0 gone."""
    run = tmp_path / "timeout"
    procs = start_two_ranks(base, run, "distributed.step_timeout_s=3")
    try:
        wait_for_step_2(run, procs)
        started = time.monotonic()
        procs[0].wait(timeout=60)
        waited = time.monotonic() - started
        (run / "stop-stalling").touch()
        procs[1].wait(timeout=60)
    finally:
        kill_all(procs)
    out0, out1 = ((run / f"out{r}.txt").read_text() for r in (0, 1))
    assert [p.returncode for p in procs] == [1, 1], out0[-3000:] + out1[-3000:]
    assert 3 <= waited < 30, waited  # the step timeout, not the 60 s start-up one
    for r in (0, 1):
        assert json.loads((run / f"timeouts{r}.json").read_text()) == {
            "default": 3.0,
            "checkpoints": 3.0,
        }
    said = "error: rank 0: step 2: a collective timed out in all_reduce (torch/distributed/"
    assert said in out0 and "called from bucketed_all_reduce.<locals>.flush (pretrain/" in out0
    assert f"every thread's stack in {run / 'stacks' / 'rank0.txt'}" in out0
    assert f'File "{REPO / "pretrain"}' not in out0  # one line, no traceback
    stacks0 = (run / "stacks" / "rank0.txt").read_text()
    assert "step 2 has run" in stacks0 and "it waits in all_reduce" in stacks0
    assert "in bucketed_all_reduce" in stacks0 and "Timed out waiting 3000ms" in stacks0
    stacks1 = (run / "stacks" / "rank1.txt").read_text()
    assert "rank 1: step 2 has run" in stacks1 and "it waits in stall_in_rank_1" in stacks1
    assert "error: rank 1: step 2: a collective" in out1
    assert ck.CheckpointDirectory(run / "checkpoints").steps() == []


@pytest.mark.slow
def test_sigterm_stops_a_rank_blocked_in_a_collective_in_bounded_time(base, tmp_path):
    """Rank 0 waits in an all-reduce for rank 1, which stalls. SIGTERM to both: the handler
    cannot run while the collective blocks, so each rank's watchdog writes its stacks and one
    line and exits 143 after distributed.stop_grace_s (2 s); nothing is published."""
    run = tmp_path / "term"
    procs = start_two_ranks(base, run, "distributed.stop_grace_s=2")
    try:
        wait_for_step_2(run, procs)
        time.sleep(1.0)  # rank 0 reaches its all-reduce
        started = time.monotonic()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        took = time.monotonic() - started
    finally:
        kill_all(procs)
    out0, out1 = ((run / f"out{r}.txt").read_text() for r in (0, 1))
    assert [p.returncode for p in procs] == [143, 143], out0[-3000:] + out1[-3000:]
    assert 2 <= took < 15, took
    said = "error: rank 0: SIGTERM 2 s ago and step 2 has not reached the ranks' agreed stop "
    assert said + "(it waits in all_reduce (torch/distributed/" in out0
    assert "called from bucketed_all_reduce" in out0 and "exiting 143 without a checkpoint" in out0
    assert "(it waits in stall_in_rank_1 (tests/hang_callbacks.py:" in out1
    assert "bucketed_all_reduce" in (run / "stacks" / "rank0.txt").read_text()
    assert "stall_in_rank_1" in (run / "stacks" / "rank1.txt").read_text()
    assert ck.CheckpointDirectory(run / "checkpoints").steps() == []


def test_a_phase_past_its_timeout_dumps_every_thread_then_says_it_finished(tmp_path, capfd):
    """The watchdog in one process: a phase armed for 0.2 s that runs 1 s is dumped once, naming
    where the training thread waits, and the dump then says when the phase ended."""
    from pretrain.watchdog import Watchdog

    watchdog = Watchdog(tmp_path, rank=3, grace_s=60)
    try:
        watchdog.arm("step 7", 0.2)
        time.sleep(1.0)
        watchdog.disarm()
    finally:
        watchdog.close()
    dump = (tmp_path / "stacks" / "rank3.txt").read_text()
    assert dump.count("rank 3: step 7 has run") == 1
    here = "it waits in test_a_phase_past_its_timeout_dumps_every_thread_then_says_it_finished"
    assert here in dump and "thread pretrain-watchdog" in dump and "thread MainThread" in dump
    assert "rank 3: step 7 finished after 1." in dump
    assert "rank 3: step 7 has run" in capfd.readouterr().err


def test_only_a_collective_error_becomes_a_collective_failure(tmp_path):
    """gloo's plain RuntimeError and torch's DistError are named; the project's own errors are not,
    even when they quote a "timed out" (an NFS write, say)."""
    import torch.distributed as dist

    from pretrain.checkpoint_manager import CheckpointWriteError
    from pretrain.watchdog import Watchdog

    watchdog = Watchdog(tmp_path, rank=0, grace_s=60)
    try:
        timed_out = RuntimeError("[pair.cc:78] Timed out waiting 3000ms for recv operation")
        failure = watchdog.failure(timed_out, 3)
        assert failure is not None and "a collective timed out" in str(failure)
        assert "Timed out waiting 3000ms" in str(failure) and "[pair.cc" not in str(failure)
        assert watchdog.failure(dist.DistBackendError("NCCL communicator aborted"), 3) is not None
        assert watchdog.failure(CheckpointWriteError("OSError: Connection timed out"), 3) is None
        assert watchdog.failure(RuntimeError("shape mismatch"), 3) is None
    finally:
        watchdog.close()


def test_the_plan_shows_the_collective_timeouts(base):
    code, out, err = run_launch("--config", str(base[1]), "--plan")
    assert code == 0, out + err
    [row] = [line for line in out.splitlines() if line.startswith("collective timeout")]
    assert "30 min start-up, 600 s per step" in row and "from step 2 on, every group" in row
    code, out, err = run_launch(
        "--config", str(base[1]), "--plan", "--set", "distributed.step_timeout_s=1e-6"
    )
    assert "TOO SHORT" in out and "raise distributed.step_timeout_s" in out


# Publishing at scale -----------------------------------------------------------------------------
def test_rank_0_publishes_without_syncing_the_ranks_files(base, tmp_path, monkeypatch):
    """Each rank syncs the files it writes (DCP's shards, its state file); the publish on rank 0
    syncs directories only, not the thousands of files of a large run."""
    from recurrent_model import atomic_io

    synced: list[tuple[Path, bool]] = []  # (path, a directory)
    real = atomic_io.fsync_path

    def recording(path):
        synced.append((Path(path), Path(path).is_dir()))
        real(path)

    monkeypatch.setattr(atomic_io, "fsync_path", recording)
    run = tmp_path / "published"
    code, out, err = run_launch("--config", str(base[1]), "--out", str(run), "--max-steps", "2")
    assert code == 0, out + err
    files = [p for p, is_dir in synced if "step-0000002" in str(p) and not is_dir]
    assert len(synced) > 3 and files == [], files


# Logs ---------------------------------------------------------------------------------------------
def test_a_torn_metrics_line_is_repaired_on_resume(base, tmp_path):
    run = copy_run(base, tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 5.1, "grad_n')  # a write cut short by a kill
    code, out, err = resume(base, run, "--max-steps", "5", "--set", "train.max_steps=5")
    assert code == 0, out + err
    assert "metrics.jsonl: its last line was torn (a write cut short): dropped" in out
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5]


def test_a_damaged_metrics_file_is_a_named_error(base, tmp_path):
    run = copy_run(base, tmp_path)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(b"".join([lines[0], b"\xff\xfe garbage\n", *lines[1:]]))
    code, out, err = resume(base, run, "--max-steps", "5", "--set", "train.max_steps=5")
    assert code == 1 and err.count("\n") == 1, out + err
    assert "metrics.jsonl line 2 is not a metrics record (UnicodeDecodeError)" in err
    assert ck.CheckpointDirectory(run / "checkpoints").steps() == [2, 4]  # nothing trained


def test_a_fresh_launch_never_appends_to_earlier_metrics(base, tmp_path):
    run = tmp_path / "fresh"
    run.mkdir()
    earlier = '{"step": 1, "loss": 9.0}\n'  # a launch killed before its first checkpoint
    (run / "metrics.jsonl").write_text(earlier)
    code, out, err = run_launch("--config", str(base[1]), "--out", str(run), "--max-steps", "1")
    assert code == 0, out + err
    assert "metrics.jsonl of an earlier launch (no checkpoint) moved to" in out
    assert [r["loss"] != 9.0 for r in metrics(run)] == [True]
    assert (run / "metrics.previous-1.jsonl").read_text() == earlier
