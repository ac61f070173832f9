"""bench/bench_gpu_train.py without a GPU: it refuses in one line, and its fsdp state-dtype probe
(the part it runs on a GPU after training) works on the CPU with gloo and a bf16 policy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from pretrain.precision import resolve_precision
from recurrent_model import preset

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_gpu_train.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu_train", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_refuses_in_one_line_without_a_gpu(bench, capsys):
    assert bench.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench_gpu_train: no GPU visible (CUDA or ROCm); nothing measured"]


def test_fsdp_state_probe_reports_the_float32_state(bench):
    config = preset("small", n_embd=32, n_heads=2, vocab_size=300, block_size=16)
    precision = resolve_precision("bf16", "cpu")
    dtypes = bench.state_dtypes_under_fsdp(config, torch.device("cpu"), precision, tokens=16)
    assert dtypes["core.hook_state"] == dtypes["hook_e"] == "float32"
    assert dtypes["core.0 norm weights"] == "float32"
    assert dtypes["core.0.hook_mlp_out"] == "bfloat16"
    assert bench.state_is_float32(dtypes)
    assert not bench.state_is_float32({**dtypes, "core.hook_state": "bfloat16"})
