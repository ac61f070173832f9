"""``launch.py --init-from OUT``: a run starts from a converted retrofitted checkpoint's weights
(fresh optimizer, step 0), the model section is OUT's, a run stopped and resumed continues bit for
bit, checkpoints and exports are of the retrofitted family, two gloo ranks with FSDP train it, and
the fault table's rows for the reader (OUT missing, a truncated safetensors file, a misshapen
tensor, a config.json of another family, a conflicting ``--set model.*``) are each refused in one
line with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, losses, run_launch, tree_digest, write_config, write_corpus
from safetensors.torch import load_file, save_file
from test_retrofit_conversion import SIZES, llama_tensors, write_llama

import recurrent_model as rm
from pretrain.callbacks import TrainerCallback
from pretrain.config import load_config
from pretrain.launch import train
from pretrain.retrofit import convert

VOCAB = 320  # the tiny config's data.vocab_size
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(root, converted OUT, training config): a synthetic 8-layer Llama with the tiny config's
    vocabulary, converted 2-2-2, and a 4-step config on a small corpus."""
    root = tmp_path_factory.mktemp("init_from")
    tensors = llama_tensors()
    vocab = {"model.embed_tokens.weight", "lm_head.weight"}
    g = torch.Generator().manual_seed(1)
    for key in vocab:  # the tiny corpus's tokenizer has 320 ids
        tensors[key] = 0.2 * torch.randn(VOCAB, SIZES["hidden"], generator=g)
    write_llama(root / "llama", tensors, vocab_size=VOCAB)
    convert(root / "llama", root / "out", 2, 2, 2)
    write_corpus(root / "corpus", docs=60)
    config = write_config(
        root / "tiny.yaml",
        root / "corpus",
        root / "data",
        max_steps=4,
        micro_batch_size=1,
        checkpoint_every=2,
        keep_last=5,
        health_every=2,
        val_every=2,
        val_batches=1,
        tensorboard=False,
    )
    return root, root / "out", config


class FirstWeights(TrainerCallback):
    """The model's weights and the optimizer's state when the run starts."""

    def on_run_start(self, trainer) -> None:
        self.weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        self.step, self.moments = trainer.step, len(trainer.optimizer.state)
        self.model_class = type(trainer.model).__name__


@pytest.fixture(scope="module")
def whole_run(source) -> tuple[Path, FirstWeights]:
    """The uninterrupted 4-step run from OUT, with its first weights."""
    root, out, config = source
    first = FirstWeights()
    cfg = load_config(config, [], str(out))
    assert train(cfg, root / "whole", callbacks=[first]) == 0
    return root / "whole", first


def test_the_run_starts_from_the_converted_weights_with_a_fresh_optimizer(source, whole_run):
    _, out, _ = source
    run, first = whole_run
    assert first.model_class == "RetrofitLM" and first.step == 0 and first.moments == 0
    stored = rm.load_model(out).state_dict()
    assert first.weights.keys() == stored.keys()
    for key, value in stored.items():
        assert torch.equal(first.weights[key], value), key
    info = json.loads((run / "run.json").read_text())
    assert info["init_from"] == str(out) and info["model"]["n_layers_in_recurrent_block"] == 2
    assert info["config"]["model"] == {"preset": "small", "overrides": {}, "init_from": str(out)}


def test_checkpoints_and_exports_are_the_retrofitted_family(whole_run):
    run, _ = whole_run
    step = run / "checkpoints" / "step-0000004"
    model = rm.load_model(step)
    assert type(model).__name__ == "RetrofitLM"
    assert "lm_head.weight" in load_file(step / WEIGHTS)  # the converted head is untied
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["mean_recurrence"] for r in records] == [32] * 4  # OUT's r̄ without a curriculum


def test_a_stopped_and_resumed_run_continues_bit_for_bit(source, whole_run):
    root, out, config = source
    run = root / "halves"
    first = run_launch("--config", str(config), "--out", str(run), "--init-from", str(out),
                       "--max-steps", "2")  # fmt: skip
    assert first[0] == 0, first
    second = run_launch("--config", str(config), "--out", str(run), "--init-from", str(out),
                        "--resume")  # fmt: skip
    assert second[0] == 0, second
    assert "resumed from" in second[1]
    assert losses(run) == losses(whole_run[0])
    whole = load_file(whole_run[0] / "checkpoints" / "step-0000004" / WEIGHTS)
    halves = load_file(run / "checkpoints" / "step-0000004" / WEIGHTS)
    assert all(torch.equal(whole[k], halves[k]) for k in whole)


def test_a_resume_without_init_from_is_refused(source, whole_run, tmp_path):
    _, _, config = source
    run = tmp_path / "run"
    shutil.copytree(whole_run[0], run)
    code, _, err = run_launch("--config", str(config), "--out", str(run), "--resume",
                              "--max-steps", "6")  # fmt: skip
    assert code == 2
    assert "holds a Retrofitted model, this run's config a Huginn one" in err
    assert len(err.strip().splitlines()) == 1


# The fault table's rows for --init-from ---------------------------------------------------------
def damaged(out: Path, tmp_path: Path, fault: str) -> Path:
    """A copy of OUT with one fault; the path to pass to --init-from."""
    if fault == "missing":
        return tmp_path / "absent"
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    weights = bad / WEIGHTS
    if fault == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) - 100])
    elif fault == "misshapen":
        tensors = load_file(weights)
        tensors["transformer.adapter.weight"] = tensors["transformer.adapter.weight"][
            :, :-1
        ].contiguous()
        save_file(tensors, weights, metadata={"format": "pt"})
    elif fault == "other_family":
        rm.RecurrentLM(rm.preset("tiny", vocab_size=VOCAB)).save_pretrained(tmp_path / "huginn")
        shutil.copyfile(tmp_path / "huginn" / "config.json", bad / "config.json")
    return bad


FAULTS = {
    "missing": "no such checkpoint directory",
    "truncated": "is not a readable safetensors file",
    "misshapen": "tensor transformer.adapter.weight has shape [16, 31]",
    "other_family": "its config.json is of the Huginn family; --init-from starts from a "
    "Retrofitted checkpoint",
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_bad_init_from_checkpoint_is_refused_in_one_line(source, tmp_path, fault):
    _, out, config = source
    start = damaged(out, tmp_path, fault)
    run = tmp_path / "run"
    run.mkdir()
    before = tree_digest(tmp_path)
    code, stdout, err = run_launch("--config", str(config), "--out", str(run), "--init-from",
                                   str(start))  # fmt: skip
    assert code == 2, stdout + err
    assert len(err.strip().splitlines()) == 1 and FAULTS[fault] in err, err
    assert err.startswith(f"error: --init-from {start}")
    assert tree_digest(tmp_path) == before and not any(run.iterdir())


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("model.overrides.n_embd=64", "model.overrides.n_embd=64 conflicts with --init-from"),
        ("model.overrides.mean_recurrence=4", "config.json has mean_recurrence=32"),
        ("model.preset=tiny", "--set model.preset conflicts with --init-from"),
        ("model.overrides.sandwich=1", "config.json has no field sandwich"),
        ("data.vocab_size=512", "data.vocab_size=512 but the --init-from model"),
    ],
)
def test_a_conflicting_setting_is_refused_in_one_line(source, tmp_path, setting, says):
    _, out, config = source
    run = tmp_path / "run"
    code, stdout, err = run_launch("--config", str(config), "--out", str(run), "--init-from",
                                   str(out), "--set", setting)  # fmt: skip
    assert code == 2, stdout + err
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert not run.exists()


def test_settings_that_repeat_the_checkpoint_and_huginn_only_options(source):
    _, out, config = source
    same = load_config(config, ["model.overrides.n_embd=16"], str(out))
    assert same.model_config().n_embd == 16
    with pytest.raises(ValueError, match="train.activation_checkpointing is offered for Huginn"):
        load_config(config, ["train.activation_checkpointing=true"], str(out))


# Two gloo ranks ---------------------------------------------------------------------------------
def launch_two_ranks(config: Path, out: Path, start: Path, *options: str) -> str:
    """launch.py --nproc 2 --init-from START into ``out``; returns its output."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}{os.pathsep}{REPO}",
               PRETRAIN_PEAK_FLOPS="1e11")  # fmt: skip
    cmd = [sys.executable, "pretrain/launch.py", "--config", str(config), "--out", str(out),
           "--init-from", str(start), "--nproc", "2", *options]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def ddp_two_ranks(source) -> Path:
    """4 steps of 2 DDP ranks from OUT, the run the other strategies are compared with."""
    root, out, config = source
    launch_two_ranks(config, root / "ddp2", out, "--set", "distributed.strategy=ddp")
    return root / "ddp2"


def assert_like(run: Path, reference: Path) -> None:
    """The same losses and (to Adam's rounding) the same weights after 4 steps."""
    assert losses(run) == pytest.approx(losses(reference), rel=1e-5)
    a = load_file(reference / "checkpoints" / "step-0000004" / WEIGHTS)
    b = load_file(run / "checkpoints" / "step-0000004" / WEIGHTS)
    assert a.keys() == b.keys() and "lm_head.weight" in a
    for key in a:  # atan2 without ε turns rounding in near-zero moments into ~1e-6 differences
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5)
    assert type(rm.load_model(run / "checkpoints" / "step-0000004")).__name__ == "RetrofitLM"


@pytest.mark.slow
def test_two_fsdp_ranks_train_from_it_and_resume_like_ddp(source, ddp_two_ranks):
    """FSDP2 on 2 gloo ranks: 2 steps, then --resume for 2 more, matches 4 DDP steps."""
    root, out, config = source
    fsdp = root / "fsdp2"
    fsdp_set = ("--set", "distributed.strategy=fsdp")
    launch_two_ranks(config, fsdp, out, *fsdp_set, "--max-steps", "2")
    assert (fsdp / "checkpoints" / "latest").read_text().strip() == "step-0000002"
    launch_two_ranks(config, fsdp, out, *fsdp_set, "--resume")
    assert_like(fsdp, ddp_two_ranks)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["bucketed", "hsdp"])
def test_the_other_strategies_train_from_it_like_ddp(source, ddp_two_ranks, strategy):
    root, out, config = source
    run = root / strategy
    launch_two_ranks(config, run, out, "--set", f"distributed.strategy={strategy}")
    assert_like(run, ddp_two_ranks)
