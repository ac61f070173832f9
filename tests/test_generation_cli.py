"""python -m recurrent_model (recurrent_model.cli): streaming, iterations per token, clear errors."""

from __future__ import annotations

import io
import os
import re
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
    assert "bytes" in err and "available" in err
    # the command line's flags, not the library's keyword arguments (tiny: 2 core layers)
    assert "--cache-budget 8" in err and "--num-steps" in err
    assert "cache_budget" not in err and err.count("\n") == 1


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


def one_line_error(capsys, *args: str) -> str:
    """Run the CLI expecting exit status 2 and a single stderr line; returns that line."""
    rc, _ = run(*args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_cuda_device_without_cuda_is_one_line(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = one_line_error(
        capsys, "--checkpoint", str(checkpoint), "--prompt", "x", "--device", "cuda"
    )
    assert "--device cuda" in err and "--device cpu" in err
    err = one_line_error(
        capsys, "--checkpoint", str(checkpoint), "--prompt", "x", "--device", "gpu"
    )
    assert "'gpu' is not a device name" in err


def test_empty_prompt_is_refused(checkpoint, capsys):
    for prompt in ("", "   "):
        err = one_line_error(capsys, "--checkpoint", str(checkpoint), "--prompt", prompt)
        assert "--prompt is empty" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--diffusion", "--exit", "kl"], "--diffusion .* cannot honour --exit"),
        (["--diffusion", "--cache-budget", "8", "--compile"], "--cache-budget, --compile"),
        (["--headway", "2"], "--headway only apply with --diffusion"),
        (["--compile", "--exit", "kl"], "--compile decodes at a fixed depth"),
    ],
)
def test_flags_that_would_be_ignored_are_refused(checkpoint, capsys, flags, message):
    err = one_line_error(capsys, "--checkpoint", str(checkpoint), "--prompt", "x", *flags)
    assert re.search(message, err), err


def test_compile_announces_itself_before_compiling(checkpoint, capsys, monkeypatch):
    seen = []

    def generate(self, *args, **kwargs):  # stands in for the slow first compile
        seen.append((kwargs["compile"], capsys.readouterr().err))
        raise ValueError("stopped before compiling")

    monkeypatch.setattr(rm.RecurrentLM, "generate", generate)
    rc, _ = run("--checkpoint", str(checkpoint), "--prompt", "x", "--compile")
    assert rc == 2 and seen == [(True, "compiling (first call only)...\n")]
    assert capsys.readouterr().err == "error: stopped before compiling\n"
    run("--checkpoint", str(checkpoint), "--prompt", "x")
    assert seen[-1] == (False, "")


def test_tokenizer_of_another_vocabulary_is_refused(checkpoint, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    rm.save_pretrained(rm.RecurrentLM(rm.preset("tiny", vocab_size=VOCAB + 64)), tmp_path / "w")
    shutil.copy(tmp_path / "w" / "config.json", other / "config.json")
    err = one_line_error(capsys, "--checkpoint", str(other), "--prompt", "x")
    assert f"has {VOCAB} tokens but the model's vocab_size is {VOCAB + 64}" in err


def test_argument_errors_come_before_torch_is_imported(tmp_path):
    code = (
        "import sys\n"
        "from recurrent_model.cli import main\n"
        "rc = main(['--checkpoint', sys.argv[1], '--prompt', 'x', '--threshold', '0.1'])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert proc.stderr.count("\n") == 1 and "--threshold only applies with an adaptive exit" in (
        proc.stderr
    )


def test_cli_names_match_the_library():
    from recurrent_model import cli
    from recurrent_model.diffusion import FREEZE_STRATEGIES
    from recurrent_model.sampling import EXIT_CRITERIA

    choices = {a.dest: a.choices for a in cli.build_parser()._actions}
    assert choices["exit"] == EXIT_CRITERIA and choices["freeze_strategy"] == FREEZE_STRATEGIES


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--threshold", "0.1"], "--threshold only applies with an adaptive exit: add --exit"),
        (["--min-steps", "2", "--threshold", "1"], "--threshold and --min-steps only apply"),
        (["--lookahead", "3"], "--lookahead only applies with --draft-steps"),
        (["--exit", "kl", "--num-steps", "3", "--min-steps", "5"], "--min-steps 5 exceeds"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
        (["--top-p", "7", "--sample"], "--top-p"),
    ],
)
def test_errors_name_the_flags_typed(checkpoint, capsys, flags, message):
    err = one_line_error(capsys, "--checkpoint", str(checkpoint), "--prompt", "x", *flags)
    assert message in err, err
    for name in ("exit_threshold", "min_steps", "max_steps", "top_p", "lookahead needs"):
        assert name not in err, err


def test_a_cut_max_new_tokens_says_so_in_one_line(checkpoint, capsys):
    long = "the cat sat on the mat " * 20  # leaves a few tokens of the 128-token context
    rc, text = run("--checkpoint", str(checkpoint), "--prompt", long, "--num-steps", "1",
                   "--max-new-tokens", "100000", "--init-scale", "0")  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0 and err.count("\n") == 1
    assert re.match(r"note: --max-new-tokens 100000 is cut to \d+: the context holds 128", err)
    rc, _ = run("--checkpoint", str(checkpoint), "--prompt", long, "--num-steps", "1",
                "--init-scale", "0")  # fmt: skip
    assert rc == 0 and capsys.readouterr().err == ""  # the default is cut without a word


def test_long_work_prints_its_estimate_then_progress(checkpoint, capsys, monkeypatch):
    import time

    from recurrent_model import cli_progress

    monkeypatch.setattr(cli_progress, "PROGRESS_EVERY_S", 0.2)
    monkeypatch.setattr(cli_progress, "MIN_FLOPS", 0.0)
    monkeypatch.setattr(cli_progress, "LONG_S", 0.0)

    def generate(self, prompt, max_new, **kwargs):  # a slow decoder: one token, then a wait
        kwargs["streamer"](torch.tensor([5]), torch.tensor([3]))
        time.sleep(1.6)
        raise ValueError("top_p must lie in (0, 1]")

    monkeypatch.setattr(rm.RecurrentLM, "generate", generate)
    rc, _ = run("--checkpoint", str(checkpoint), "--prompt", "the cat", "--max-new-tokens", "4")
    err = capsys.readouterr().err
    assert rc == 2
    assert re.search(r"^estimate: ≈ \d+ s for 4 tokens × \d+ iterations \(.* GFLOP/s\)$", err,
                     re.M), err  # fmt: skip
    assert re.search(r"^\[\d+ s of ≈ \d+ s\] 1/4 tokens, about \d+ s left$", err, re.M), err
    assert err.endswith("error: --top-p must lie in (0, 1]\n")
