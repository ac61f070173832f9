"""End-to-end training on a tiny corpus: checkpoints, exact resume after kill -9, a kill during a
checkpoint write, loading the result with recurrent_model, metrics. CPU, a few seconds per run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, write_config, write_corpus
from safetensors.torch import load_file

import recurrent_model
from pretrain.checkpointing import CheckpointDirectory
from pretrain.launch import main as launch_main


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    write_corpus(root / "corpus")
    config = write_config(root / "tiny.yaml", root / "corpus", root / "data")
    straight = root / "straight"
    assert launch_main(["--config", str(config), "--out", str(straight)]) == 0
    return root, config, straight


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def driver(tmp: Path, body: str) -> Path:
    path = tmp / f"driver_{abs(hash(body)) % 10**8}.py"
    path.write_text(
        "import sys, time\n" + body + "\nfrom pretrain.launch import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return path


def start(script: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.05)


def test_run_writes_huginn_checkpoints_metrics_and_validation(setup):
    _, _, run = setup
    manager = CheckpointDirectory(run / "checkpoints")
    assert manager.steps() == [4, 8]  # keep_last = 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-0000008"
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all(r["loss"] > 0 and "depth_grad" in r and "tokens_per_s" in r for r in rows)
    last = rows[-1]
    for d in (1, 4, 8):  # 1, 4, 8, r̄ = 4, 2r̄ = 8
        assert f"val_loss_{d}" in last
    assert 0 < last["health/step_rel"] and -1 <= last["health/token_corr_latent"] <= 1
    assert rows[-1]["loss"] < rows[0]["loss"]


def test_checkpoint_loads_with_recurrent_model_and_generates(setup):
    _, _, run = setup
    model = recurrent_model.load_model(run / "checkpoints" / "step-0000008")
    assert model.tokenizer is not None and model.config.n_embd == 32
    ids = torch.tensor([model.tokenizer.encode("the model")])
    out = model.generate(ids, max_new_tokens=4, num_steps=4)
    assert out.shape == (1, ids.shape[1] + 4)
    final = run / "checkpoints" / "step-0000008"
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["step"] == 8 and "ranks" not in state and state["exported"] is True
    rank = json.loads((final / "ranks" / "rank-000000.json").read_text())
    assert rank["loader"]["split"] == "train" and set(rank["rng"]) >= {"python", "torch"}


def test_exact_resume_after_kill_9(setup, tmp_path):
    root, config, straight = setup
    run = tmp_path / "killed"
    # Steps after 5 stall, so the kill lands after checkpoint 4 and after step 5 was logged.
    script = driver(
        tmp_path,
        "import pretrain.trainer as tr\n"
        "orig = tr.Trainer.train_step\n"
        "def slow(self):\n"
        "    if self.step >= 5:\n        time.sleep(120)\n"
        "    return orig(self)\n"
        "tr.Trainer.train_step = slow\n",
    )
    proc = start(script, "--config", str(config), "--out", str(run))
    wait_for(
        lambda: (
            (run / "metrics.jsonl").is_file()
            and len((run / "metrics.jsonl").read_text().splitlines()) >= 5
        ),
        proc,
    )
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-0000004"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert launch_main(["--config", str(config), "--out", str(run), "--resume"]) == 0
    a, b = metrics(straight), metrics(run)
    assert [r["step"] for r in b] == list(range(1, 9))  # the stale step-5 line was rewound
    for ra, rb in zip(a, b):
        assert (ra["loss"], ra["depth_grad"], ra["depth_no_grad"]) == (
            rb["loss"],
            rb["depth_grad"],
            rb["depth_no_grad"],
        )
        assert ra.get("val_loss_8") == rb.get("val_loss_8")
    final_a = straight / "checkpoints" / "step-0000008"
    final_b = run / "checkpoints" / "step-0000008"
    names = sorted(str(p.relative_to(final_a)) for p in final_a.rglob("*.safetensors"))
    assert names == sorted(str(p.relative_to(final_b)) for p in final_b.rglob("*.safetensors"))
    assert any(n.startswith("shards/") for n in names) and "model.safetensors" in names
    for name in names:  # the consolidated weights and the model and optimizer shards
        ta, tb = load_file(final_a / name), load_file(final_b / name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), key


def test_kill_during_checkpoint_write_keeps_previous(setup, tmp_path):
    _, config, _ = setup
    run = tmp_path / "interrupted"
    marker = tmp_path / "writing"
    script = driver(
        tmp_path,
        "import pretrain.checkpoint_manager as tr\n"
        "orig = tr.write_state_json\n"
        "def slow(directory, state):\n"
        "    orig(directory, state)\n"
        "    if 'step-0000008' in str(directory):\n"
        f"        open({str(marker)!r}, 'w').close()\n"
        "        time.sleep(120)\n"
        "tr.write_state_json = slow\n",
    )
    proc = start(script, "--config", str(config), "--out", str(run))
    wait_for(marker.exists, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-0000004"
    assert not (ckpts / "step-0000008").exists()
    assert any(p.name.startswith(".step-0000008.tmp-") for p in ckpts.iterdir())
    model = recurrent_model.load_model(ckpts / "step-0000004")
    assert model.config.n_embd == 32
    assert launch_main(["--config", str(config), "--out", str(run), "--resume"]) == 0
    assert (ckpts / "latest").read_text().strip() == "step-0000008"
    assert not any(p.name.startswith(".step-") for p in ckpts.iterdir())  # leftovers pruned


def test_nonfinite_loss_is_skipped_counted_and_reported(setup, tmp_path, capsys):
    _, config, _ = setup
    import pretrain.trainer as tr

    orig = tr.Trainer.train_step

    def poisoned(self):
        if self.step == 2:
            with torch.no_grad():
                self.model.transformer.ln_f.weight.fill_(float("nan"))
        return orig(self)

    tr.Trainer.train_step = poisoned
    try:
        code = launch_main(
            [
                "--config",
                str(config),
                "--out",
                str(tmp_path / "nan"),
                "--set",
                "train.max_steps=40",
                "--set",
                "train.val_every=100",
                "--set",
                "train.health_every=100",
                "--set",
                "train.checkpoint_every=100",
            ]
        )
    finally:
        tr.Trainer.train_step = orig
    assert code == 1  # the 21st non-finite step in a row stops the run before its update
    rows = metrics(tmp_path / "nan")
    assert rows[2]["skipped"] is True and rows[2]["loss"] == "nan"
    assert rows[-1]["skipped_steps"] == len(rows) - 2 == 20
    captured = capsys.readouterr()
    assert "non-finite gradient norm" in captured.out
    assert captured.err.count("\n") == 1 and "21 non-finite step(s) in a row" in captured.err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_writes_a_checkpoint_and_stops(setup, tmp_path, signum):
    _, config, _ = setup
    run = tmp_path / "signalled"
    reached, go = tmp_path / "reached", tmp_path / "go"
    # A handshake instead of a timing guess: the run holds before step 3 until the signal has
    # been delivered (the test writes `go` after sending it), so it stops after exactly 3 steps.
    script = driver(
        tmp_path,
        "import pathlib\n"
        "import pretrain.trainer as tr\n"
        "orig = tr.Trainer.train_step\n"
        "def held(self):\n"
        "    if self.step == 2:\n"
        f"        pathlib.Path({str(reached)!r}).touch()\n"
        f"        while not pathlib.Path({str(go)!r}).exists():\n"
        "            time.sleep(0.01)\n"
        "    return orig(self)\n"
        "tr.Trainer.train_step = held\n",
    )
    proc = start(
        script, "--config", str(config), "--out", str(run), "--set", "train.checkpoint_every=100"
    )
    wait_for(reached.exists, proc)
    proc.send_signal(signum)
    go.touch()
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, output
    assert "signal received" in output
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-0000003"
    assert len(metrics(run)) == 3


def test_gradient_accumulation_matches_the_larger_batch(setup, tmp_path, monkeypatch):
    _, config, _ = setup
    # s_0 = 0: the random initial state is drawn per micro-batch, so it would differ between runs.
    monkeypatch.setattr(
        recurrent_model.RecurrentLM,
        "initial_state",
        lambda self, e, init_scale=1.0, generator=None: torch.zeros_like(e),
    )
    common = [
        "--set",
        "train.max_steps=3",
        "--set",
        "train.val_every=100",
        "--set",
        "train.health_every=100",
        "--set",
        "train.checkpoint_every=100",
    ]
    assert (
        launch_main(
            [
                "--config",
                str(config),
                "--out",
                str(tmp_path / "big"),
                *common,
                "--set",
                "train.micro_batch_size=2",
                "--set",
                "train.grad_accum=1",
            ]
        )
        == 0
    )
    assert (
        launch_main(
            [
                "--config",
                str(config),
                "--out",
                str(tmp_path / "acc"),
                *common,
                "--set",
                "train.micro_batch_size=1",
                "--set",
                "train.grad_accum=2",
            ]
        )
        == 0
    )
    big, acc = metrics(tmp_path / "big"), metrics(tmp_path / "acc")
    assert [r["tokens"] for r in big] == [r["tokens"] for r in acc]
    for rb, ra in zip(big, acc):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-4)
    wb = load_file(tmp_path / "big" / "checkpoints" / "step-0000003" / "model.safetensors")
    wa = load_file(tmp_path / "acc" / "checkpoints" / "step-0000003" / "model.safetensors")
    for key in wb:  # atan2 without ε turns rounding in near-zero moments into ~1e-5 differences
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-3, atol=1e-4)
