"""The fused-attention start-up check: a GPU whose SDPA would take the math path at the run's dtype,
head size and sequence is refused in one line; a fused kernel is named; the CPU says what applies."""

from __future__ import annotations

import pytest
import torch

from pretrain.precision import resolve_precision
from pretrain.startup_checks import StartupError, check_fused_attention, fused_attention_verdict
from recurrent_model import preset


def test_math_path_on_a_gpu_is_refused_in_one_line():
    none = {"flash": False, "efficient": False, "cudnn": False}
    with pytest.raises(StartupError) as err:
        fused_attention_verdict("cuda", none, torch.bfloat16, 96, 4096)
    message = str(err.value)
    assert "\n" not in message and "math path" in message
    assert "bfloat16, head size 96, 4096 tokens" in message


def test_a_fused_kernel_is_named():
    kernels = {"flash": False, "efficient": True, "cudnn": False}
    note = fused_attention_verdict("cuda", kernels, torch.bfloat16, 96, 4096)
    assert note == "attention: fused SDPA kernel(s) efficient at bfloat16, head size 96"


def test_on_the_cpu_it_says_what_applies():
    config = preset("small", n_embd=32, n_heads=2, vocab_size=300, block_size=16)
    note = check_fused_attention(torch.device("cpu"), resolve_precision("auto", "cpu"), config, 16)
    assert note.startswith("attention on cpu:") and "GPUs only" in note and "float32" in note
