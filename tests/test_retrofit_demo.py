"""eval/retrofit_demo.py: at its tiny size it writes results, a table and a figure whose numbers
are the runs' own (the recurrent runs' final validation records, the Llama re-evaluated from its
saved weights, the FLOPs summed from the drawn depths); and the table in docs/pretraining.md is the
committed result's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO
from safetensors.torch import load_file

from eval.plain_llama import PlainLlama, heldout_loss
from eval.retrofit_demo import DEPTHS, SIZES, table
from pretrain.config import load_config
from pretrain.metrics import flops_per_token
from recurrent_model import Depth

COMMITTED = REPO / "eval" / "results" / "retrofit_demo.json"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "out"
    cmd = [sys.executable, "eval/retrofit_demo.py", "--size", "tiny", "--seeds", "0", "1",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_the_outputs_have_their_structure(demo):
    out, results = demo
    assert results["size"] == "tiny" and results["depths"] == list(DEPTHS)
    assert [s["seed"] for s in results["seeds"]] == [0, 1]
    for seed in results["seeds"]:
        for route in ("retrofitted", "scratch"):
            assert set(seed[route]["heldout_loss"]) == {str(d) for d in DEPTHS}
            assert seed[route]["curriculum"]["shape"] == "1-sqrt"
    assert (out / "table.md").read_text() == table(results)
    assert (out / "retrofit_demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_every_number_comes_from_the_runs(demo):
    _, results = demo
    size = SIZES["tiny"]
    for seed in results["seeds"]:
        for route in ("retrofitted", "scratch"):
            run = Path(seed[route]["run"])
            records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            last = records[-1]
            assert seed[route]["heldout_loss"] == {str(d): last[f"val_loss_{d}"] for d in DEPTHS}
            config = load_config(run.parent / "config.yaml", [], str(run.parent.parent / (
                "converted" if route == "retrofitted" else "scratch-init")))  # fmt: skip
            tokens = config.train.micro_batch_size * config.data.block_size
            model, block = config.model_config(), config.data.block_size
            drawn = sum(
                flops_per_token(model, Depth(r["depth_no_grad"], r["depth_grad"]), block) * tokens
                for r in records
            )
            assert seed[route]["flops"] == pytest.approx(drawn, rel=1e-12)
        assert seed["scratch"]["flops"] >= seed["retrofitted_total_flops"]
        assert seed["retrofitted_total_flops"] == seed["llama"]["flops"] + seed["retrofitted"][
            "flops"]  # fmt: skip
        llama = PlainLlama(size.llama)
        llama.load_state_dict(load_file(Path(seed["llama"]["directory"]) / "model.safetensors"))
        batches = validation_batches(seed, size)
        assert heldout_loss(llama, batches) == pytest.approx(seed["llama"]["heldout_loss"], 1e-6)


def validation_batches(seed: dict, size) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out batches the runs validate on (the trainer's: seed 0, first val_batches)."""
    from pretrain.data import PackedLoader, load_prepared

    run = Path(seed["retrofitted"]["run"])
    config = load_config(run.parent / "config.yaml", [], str(run.parent.parent / "converted"))
    prepared = load_prepared(Path(config.data.cache_dir), config.data.data_config())
    loader = PackedLoader(prepared, "val", size.micro_batch_size, 0, 1, seed=0)
    return [batch for batch, _ in zip(loader, range(size.val_batches), strict=False)]


def test_the_docs_table_is_the_committed_result():
    results = json.loads(COMMITTED.read_text())
    assert results["size"] == "demo" and len(results["seeds"]) >= 2
    rendered = table(results)
    assert (REPO / "eval" / "results" / "retrofit_demo.md").read_text() == rendered
    assert rendered in (REPO / "docs" / "pretraining.md").read_text()
    assert (REPO / "docs" / "images" / "retrofit_demo.png").is_file()
