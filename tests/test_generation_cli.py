"""python -m recurrent_model (recurrent_model.cli): streaming, iterations per token, clear errors."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

import recurrent_model as rm
from recurrent_model.cli import main
from recurrent_model.tokenizer import SPECIAL_TOKENS, special_token_offset

VOCAB = 320


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE with the Huginn specials at V − 32 …"""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 32, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the cat sat on the mat", "def f(x): return x + 1"] * 20, trainer)
    while tok.get_vocab_size() < special_token_offset(VOCAB):
        tok.add_tokens([f"<|filler_{tok.get_vocab_size()}|>"])
    specials = list(SPECIAL_TOKENS) + [f"<|reserved_{i}|>" for i in range(32 - len(SPECIAL_TOKENS))]
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    build_tokenizer().save(str(root / "tokenizer.json"))
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny", vocab_size=VOCAB))
    model.tokenizer = rm.HuginnTokenizer.from_file(root / "tokenizer.json")
    model.save_pretrained(root / "ck")
    return root / "ck"


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(args), out=out), out.getvalue()


def iterations(text: str) -> list[int]:
    line = next(x for x in text.splitlines() if x.startswith("iterations per token:"))
    return [int(v) for v in line.split(":")[1].split()]


def test_streams_text_and_iterations(checkpoint):
    rc, text = run("--checkpoint", str(checkpoint), "--prompt", "the cat", "--num-steps", "3",
                   "--max-new-tokens", "6", "--init-scale", "0")  # fmt: skip
    assert rc == 0
    steps = iterations(text)
    assert 1 <= len(steps) <= 6 and set(steps) == {3}
    assert "mean 3.00 iterations per token" in text


def test_chat_exit_and_speculative_flags(checkpoint):
    base = ["--checkpoint", str(checkpoint), "--prompt", "the cat", "--max-new-tokens", "5"]
    rc, text = run(*base, "--chat", "--exit", "kl", "--threshold", "1e9", "--num-steps", "4")
    assert rc == 0 and set(iterations(text)) == {1}
    rc, text = run(*base, "--draft-steps", "1", "--lookahead", "3", "--num-steps", "3")
    assert rc == 0 and "speculative acceptance rate:" in text


def test_prompt_longer_than_context(checkpoint, capsys):
    rc, _ = run("--checkpoint", str(checkpoint), "--prompt", "the cat sat on the mat " * 60)
    assert rc == 2
    assert "context" in capsys.readouterr().err


def test_unknown_criterion(checkpoint, capsys):
    with pytest.raises(SystemExit) as exc:
        run("--checkpoint", str(checkpoint), "--prompt", "x", "--exit", "nope")
    assert exc.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_bad_checkpoints(tmp_path, capsys):
    rc, _ = run("--checkpoint", str(tmp_path / "missing"), "--prompt", "x")
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    rc, _ = run("--checkpoint", str(tmp_path), "--prompt", "x")
    assert rc == 2 and "config.json" in capsys.readouterr().err


def test_checkpoint_without_tokenizer(tmp_path, capsys):
    rm.RecurrentLM(rm.preset("tiny")).save_pretrained(tmp_path / "ck")
    rc, _ = run("--checkpoint", str(tmp_path / "ck"), "--prompt", "x")
    assert rc == 2 and "no tokenizer.json" in capsys.readouterr().err


def test_cache_that_cannot_fit_fails_early_naming_bytes(checkpoint, capsys):
    # 10^8 iterations of 2 core layers: a KV cache of terabytes; refused before allocating
    rc, _ = run("--checkpoint", str(checkpoint), "--prompt", "the cat", "--num-steps", "100000000")
    err = capsys.readouterr().err
    assert rc == 2
    assert "bytes" in err and "cache_budget" in err and "available" in err


def test_runs_as_python_dash_m(checkpoint):
    proc = subprocess.run(
        [sys.executable, "-m", "recurrent_model", "--checkpoint", str(checkpoint), "--prompt",
         "the cat", "--num-steps", "2", "--max-new-tokens", "3", "--init-scale", "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "iterations per token: 2" in proc.stdout


def test_diffusion_flag_prints_the_sampler_tokens(checkpoint):
    rc, text = run("--checkpoint", str(checkpoint), "--prompt", "the cat", "--diffusion",
                   "--num-steps", "4", "--inner-recurrence", "2", "--max-new-tokens", "6",
                   "--init-scale", "0")  # fmt: skip
    assert rc == 0
    model = rm.load_model(checkpoint)
    ids = torch.tensor([model.tokenizer.encode("the cat")])
    out = model.generate_diffusion(ids, 6, num_steps=4, inner_recurrence=2, init_scale=0.0,
                                   return_details=True)  # fmt: skip
    new = out.sequences[0, ids.shape[1] :].tolist()
    assert text.startswith(model.tokenizer.decode(new, skip_special_tokens=True))
    spent = out.recurrence_per_position[ids.shape[1] : ids.shape[1] + len(new)].tolist()
    assert iterations(text) == spent
    assert f"{len(new)} tokens in {out.sampler_steps} sampler steps" in text
