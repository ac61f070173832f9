"""The checkpoint evaluation script: scoring logic and an end-to-end run on a tiny checkpoint."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import recurrent_model as rm
from pretrain.data import DataConfig, prepare_data
from tasks.arithmetic import make_problems

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "evaluate_checkpoint", ROOT / "eval" / "evaluate_checkpoint.py"
)
evaluate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evaluate)
depth_tasks = sys.modules["depth_tasks"]  # imported by evaluate_checkpoint from eval/

DATA = {
    "sources": ["starter"],
    "starter_size": "tiny",
    "vocab_size": 512,
    "block_size": 64,
    "seed": 0,
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random model with a tokenizer trained on the tiny starter corpus, plus provenance."""
    root = tmp_path_factory.mktemp("eval")
    prepared = prepare_data(DataConfig(**DATA), root / "data", progress=False)
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny", vocab_size=512, block_size=256, mean_recurrence=2))
    model.tokenizer = rm.HuginnTokenizer.from_file(prepared.tokenizer_path)
    model.save_pretrained(root / "ck")
    (root / "ck" / "provenance.json").write_text(json.dumps({"config": {"data": DATA}}))
    return root / "ck"


def test_depth_grid_covers_the_paper_depths():
    assert evaluate.depth_grid(8) == [1, 2, 4, 8, 16, 32]
    assert evaluate.depth_grid(32) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert evaluate.depth_grid(4) == [1, 2, 4, 8, 16]


def test_arithmetic_scoring_reads_answers_after_left_padded_prompts(checkpoint, monkeypatch):
    model = rm.load_model(checkpoint)
    tok = model.tokenizer
    problems = make_problems(4, 2, 1234)

    def answer(correct: bool):
        def fake_generate(ids, new_tokens, num_steps, attention_mask, **kwargs):
            rows = []
            for row, (_, ans) in zip(ids, problems, strict=True):
                text = f" {ans if correct else int(ans) + 1}\n"
                rows.append(torch.cat([row, torch.tensor(tok.encode(text, add_bos=False))]))
            return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_id)

        return fake_generate

    monkeypatch.setattr(model, "generate", answer(True))
    right = evaluate.arithmetic_accuracy(model, [1, 3], [2], n=4)
    assert right["accuracy"].tolist() == [1.0, 1.0]
    monkeypatch.setattr(model, "generate", answer(False))
    wrong = evaluate.arithmetic_accuracy(model, [1], [2], n=4)
    assert wrong["accuracy"].tolist() == [0.0]


def test_depth_task_scoring_compares_the_first_line(checkpoint, monkeypatch):
    model = rm.load_model(checkpoint)
    tok = model.tokenizer
    tasks = depth_tasks.depth.make_tasks("variables", 3, 2, 2024, split="heldout")

    def fake_generate(ids, new_tokens, num_steps, attention_mask, **kwargs):
        rows = []
        for i, (row, task) in enumerate(zip(ids, tasks, strict=True)):
            answer = task.answer if (i < 2 or num_steps > 1) else task.answer + "0"
            rows.append(torch.cat([row, torch.tensor(tok.encode(f" {answer}\nx", add_bos=False))]))
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_id)

    monkeypatch.setattr(model, "generate", fake_generate)
    frame = depth_tasks.depth_task_accuracy(model, [1, 4], {"variables": [2]}, n=3)
    assert frame["accuracy"].tolist() == pytest.approx([2 / 3, 1.0])
    assert frame["trained_level"].all()


def test_few_shot_prompt_uses_training_problems_then_the_question():
    text = evaluate.few_shot_prompt(1, "3 + 4 =", shots=3, seed=0)
    lines = text.split("\n")
    assert len(lines) == 4 and lines[-1] == "3 + 4 ="
    assert all("=" in line and line.split("=")[1].strip().isdigit() for line in lines[:3])


def test_end_to_end_writes_table_plot_and_json(checkpoint, tmp_path, one_thread):
    results = evaluate.main(
        [
            "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"),
            "--data-cache", str(tmp_path / "cache"), "--val-batches", "1", "--problems", "2",
            "--difficulties", "1", "--seeds", "2", "--threads", "1", "--code-rows", "2",
            "--task-problems", "2", "--task-kinds", "carries", "--task-max-level", "2",
        ]
    )  # fmt: skip
    assert [row["steps"] for row in results["val_loss"]] == [1, 2, 4, 8]
    assert all(row["val_loss"] > 0 for row in results["val_loss"])
    assert {row["steps"] for row in results["arithmetic"]} == {1, 2, 4, 8}
    assert abs(sum(row["share"] for row in results["dynamics_share"]) - 1) < 1e-9
    assert len(results["path_independence"]) == len(evaluate.PROMPTS)
    assert results["probes"][0]["probe"] == "iteration counter"
    assert 0 <= results["probes"][0]["test_accuracy"] <= 1
    assert results["validation_corpus_matches_training"]  # no corpus hash recorded: nothing to flag
    assert [row["steps"] for row in results["heldout_code"]] == [1, 2, 4, 8]
    assert results["heldout_code_summary"]["deepest"] == 8
    assert {(r["level"], r["steps"]) for r in results["depth_tasks"]} == {
        (lv, d) for lv in (1, 2) for d in (1, 2, 4, 8)
    }
    for name in ("results.json", "results.md", "results.html"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    table = (tmp_path / "out" / "results.md").read_text()
    assert "Validation loss by recurrence depth" in table and "iteration counter" in table
