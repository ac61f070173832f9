"""Exporting a run's checkpoint as a model directory with provenance."""

from __future__ import annotations

import json

import torch
from helpers import write_config, write_corpus

import recurrent_model as rm
from pretrain.export import main as export_main
from pretrain.launch import main as launch_main


def tiny_config(tmp_path):
    """A 4-step config on a small generated corpus under tmp_path."""
    write_corpus(tmp_path / "corpus", docs=60)
    return write_config(
        tmp_path / "tiny.yaml", tmp_path / "corpus", tmp_path / "data", max_steps=4, val_every=4
    )


def test_export_copies_model_files_and_writes_provenance(tmp_path):
    config = tiny_config(tmp_path)
    run = tmp_path / "run"
    assert launch_main(["--config", str(config), "--out", str(run)]) == 0
    out = export_main(["--run", str(run), "--out", str(tmp_path / "model"), "--note", "test run"])
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "model.safetensors", "provenance.json", "tokenizer.json"]
    record = json.loads((out / "provenance.json").read_text())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert record["steps"] == 4 and record["notes"] == ["test run"]
    assert record["tokens_seen"] == 4 * 2 * 32
    assert record["final_train_loss"] == [m["loss"] for m in metrics if "loss" in m][-1]
    assert set(record["final_val_losses"]) == {k for k in metrics[-1] if k.startswith("val_loss_")}
    assert record["config"]["data"]["vocab_size"] == 320 and len(record["corpus_hash"]) > 8
    assert record["training_time_s"] > 0 and record["commands"]
    exported = rm.load_model(out)
    source = rm.load_model(run / "checkpoints" / "step-0000004")
    for a, b in zip(exported.state_dict().values(), source.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_provenance_lists_resumes_in_order_with_the_last_config(tmp_path):
    config = tiny_config(tmp_path)
    run = tmp_path / "run"
    assert launch_main(["--config", str(config), "--out", str(run), "--max-steps", "2"]) == 0
    resume = ["--config", str(config), "--out", str(run), "--resume", "--set", "train.max_steps=6"]
    assert launch_main(resume) == 0
    record = json.loads(
        (
            export_main(["--run", str(run), "--out", str(tmp_path / "model")]) / "provenance.json"
        ).read_text()
    )
    assert record["steps"] == 6 and len(record["commands"]) == 2
    assert record["config"]["train"]["max_steps"] == 6  # what the final steps trained with


def test_export_of_a_checkpoint_between_exports_consolidates_its_shards(tmp_path):
    """With train.export_every=0 only the last checkpoint is in the Huginn layout; exporting an
    earlier one consolidates its float32 shards, the same weights the trainer held."""
    from safetensors.torch import load_file

    from pretrain.checkpointing import SHARDS_DIR, is_exported

    config = tiny_config(tmp_path)
    run = tmp_path / "run"
    args = ["--set", "train.export_every=0", "--set", "train.checkpoint_every=2"]
    assert launch_main(["--config", str(config), "--out", str(run), *args]) == 0
    step2 = run / "checkpoints" / "step-0000002"
    assert not is_exported(step2) and is_exported(run / "checkpoints" / "step-0000004")
    out = export_main(
        ["--run", str(run), "--out", str(tmp_path / "model"), "--checkpoint", "step-0000002"]
    )
    assert json.loads((out / "provenance.json").read_text())["steps"] == 2
    [shard] = (step2 / SHARDS_DIR).glob("*-model-00001-of-*.safetensors")
    saved = load_file(shard)
    exported = rm.load_model(out).state_dict()
    for key, value in saved.items():
        assert torch.equal(exported[key], value), key
    assert not any(p.name.startswith(".export-") for p in (run / "checkpoints").iterdir())
