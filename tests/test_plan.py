"""The memory plan (pretrain/plan.py, launch --plan): hand-computed numbers at the published scale,
the activation formula against the tensors autograd really saves, and the whole plan against the
measured peak memory of a few CPU training steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrain.config import TrainConfig, load_config
from pretrain.launch import main as launch_main
from pretrain.plan import (
    DEVICES,
    GIB,
    PlanError,
    activation_bytes,
    block_activation_bytes,
    count_parameters,
    logits_loss_bytes,
    plan_all,
    plan_memory,
    resolve_device,
)
from recurrent_model.layers import SandwichBlock, rope_table

REPO = Path(__file__).resolve().parent.parent
FRONTIER = REPO / "pretrain" / "configs" / "huginn-3.5b-frontier.yaml"
P = 3_564_976_800


@pytest.fixture(scope="module")
def frontier() -> TrainConfig:
    return load_config(FRONTIER)


def test_published_parameter_counts_and_fp32_states(frontier):
    counts = count_parameters(frontier.model_config())
    assert counts.total == P
    assert counts.core == 1_581_592_320
    assert set(counts.core_blocks) == {395_398_080}
    plan = plan_memory(frontier, DEVICES["mi250x"], 512, 8, "ddp", counts)
    assert plan.row("weights").bytes == 4 * P
    assert round(plan.row("weights").bytes / GIB, 2) == 13.28
    assert round(plan.row("optimizer").bytes / GIB, 2) == 26.56
    assert plan.row("communication").bytes == 4 * P  # DDP's buckets copy every gradient
    # ZeRO-1 shards only the optimizer state; FSDP all three; HSDP over the 8 GCDs of a node.
    zero1 = plan_memory(frontier, DEVICES["mi250x"], 512, 8, "bucketed", counts)
    assert zero1.row("weights").bytes == 4 * P
    # ZeRO-1 hands out whole tensors: the rank with the embedding holds its moments (2.58 GiB)
    assert zero1.row("optimizer").bytes == 8 * 65536 * 5280
    assert counts.largest_tensor == 65536 * 5280
    hsdp = plan_memory(frontier, DEVICES["mi250x"], 512, 8, "hsdp", counts)
    assert hsdp.row("optimizer").bytes == 8 * P // 8
    assert hsdp.row("weights").bytes == 4 * P // 8
    # fp32 gathered (the state stays float32): root (embedding 65536·5280 + adapter 2·5280² +
    # ln_f) + 4 core + 2 outer blocks, and autocast's bf16 copies of the same.
    root = 65536 * 5280 + 2 * 5280 * 5280 + 5280
    assert hsdp.row("gathered weights (fp32)").bytes == 4 * (root + 6 * 395_398_080)
    assert hsdp.row("bf16 weight copies").bytes == 2 * (root + 6 * 395_398_080)
    # The float32 logits of one 4096-token sequence are 1 GiB; with log-softmax and gradients 4 GiB.
    assert logits_loss_bytes(frontier.model_config(), 4096) == 4 * GIB


def test_checkpointed_activations_by_hand(frontier):
    cfg = frontier.model_config()
    h, inter = 5280, 17920
    acts = activation_bytes(cfg, 4096, 8, bf16=True)
    block = 48 * h + 8 * inter + 16 + 4 * 55
    iteration = 2 * h * 2 + 4 * block
    assert acts.checkpointed_inputs == 4096 * 9 * 4 * h
    assert acts.recomputed(True) == 4096 * iteration
    assert acts.saved(False) - acts.saved(True) == 4096 * (8 * iteration - 9 * 4 * h)
    # one checkpointed float32 state of 4096 tokens is 82.5 MiB; one recomputed core step 6.14 GiB
    assert 4096 * 4 * h / 2**20 == 82.5
    assert round(4096 * iteration / GIB, 2) == 6.14


def _saved_bytes(fn, weights: set[tuple[int, ...]]) -> int:
    """Bytes of the distinct storages autograd saves while ``fn`` runs, without the weights (and
    their autocast copies, recognised by shape), the RoPE table and other leaves."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        shape = tuple(t.shape)
        if t.is_leaf and t.requires_grad or t.is_complex():
            return t
        if t.dim() == 2 and (shape in weights or shape[::-1] in weights):
            return t
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize("bf16", [False, True])
def test_block_activation_formula_matches_saved_tensors(bf16):
    from recurrent_model import preset

    cfg = preset("tiny", n_embd=64, n_heads=4, intermediate_size=176)
    block = SandwichBlock(cfg, "core.0", iterated=True)
    B, T = 2, 40  # B·T differs from every weight dimension
    rope = rope_table(cfg.head_dim, T, cfg.rope_base)
    x = torch.randn(B, T, cfg.n_embd, requires_grad=True)
    x_in = x * 1.0  # a non-leaf float32 input, as inside the model

    def forward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            block(x_in, rope, 1)

    measured = _saved_bytes(forward, {tuple(p.shape) for p in block.parameters()})
    assert measured == B * T * block_activation_bytes(cfg, bf16)


def test_model_activations_match_saved_tensors_without_checkpointing():
    from recurrent_model import RecurrentLM, preset

    cfg = preset("tiny", n_embd=64, n_heads=4, intermediate_size=176, vocab_size=512)
    model = RecurrentLM(cfg)
    B, T, k = 2, 40, 3
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))

    def forward() -> None:
        model(ids, num_steps=k + 1, labels=ids, backprop_depth=k)

    measured = _saved_bytes(forward, {tuple(p.shape) for p in model.parameters()})
    acts = activation_bytes(cfg, B * T, k, bf16=False)
    log_softmax = 4 * cfg.vocab_size * B * T
    assert measured == pytest.approx(acts.saved(False) + log_softmax, rel=0.03)


def test_frontier_fits_and_ddp_is_refused_in_one_line(capsys):
    assert launch_main(["--config", str(FRONTIER), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "3,564,976,800 parameters" in out and "fits:" in out
    code = launch_main(["--config", str(FRONTIER), "--plan", "--set", "distributed.strategy=ddp"])
    captured = capsys.readouterr()
    assert code != 0
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "does not fit: ddp" in lines[0] and "would fit" in lines[0]
    assert "Traceback" not in captured.err


def test_frontier_strategy_has_headroom_and_devices_resolve(frontier):
    plans = plan_all(frontier, DEVICES["mi250x"], 512, 8)
    chosen = plans[frontier.distributed.strategy]
    assert chosen.fits and chosen.headroom > 0.2  # float32 gathers keep the recipe's state
    assert not plans["ddp"].fits
    assert resolve_device("NVIDIA H200").memory_gib == 141
    assert resolve_device("h100", 40).memory_gib == 40
    with pytest.raises(PlanError, match="unknown device"):
        resolve_device("tpu-v9")
    # a bigger device makes ddp fit
    assert plan_memory(frontier, DEVICES["mi300x"], 512, 8, "ddp").fits


def test_unknown_device_is_a_clear_error(capsys):
    code = launch_main(["--config", str(FRONTIER), "--plan", "--device", "abacus"])
    assert code == 2 and "unknown device 'abacus'" in capsys.readouterr().err


# Measured on the CPU --------------------------------------------------------------------------
MEASURE = r"""
import json, sys, torch
from pretrain.config import TrainConfig
from pretrain.optimizer import ClippedAtanAdam, clip_grads_, global_grad_norm, parameter_groups
from recurrent_model import RecurrentLM

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

def steps(config, n):
    cfg = config.model_config()
    torch.manual_seed(0)
    model = RecurrentLM(cfg)
    model.activation_checkpointing = config.train.activation_checkpointing
    opt = ClippedAtanAdam(parameter_groups(model, 1e-4), lr=1e-3)
    params = list(dict.fromkeys(model.parameters()))
    b, T, k = config.train.micro_batch_size, config.data.block_size, config.backprop_depth
    gen = torch.Generator().manual_seed(0)
    for _ in range(n):
        ids = torch.randint(0, cfg.vocab_size, (b, T), generator=gen)
        out = model(ids, num_steps=k + 2, labels=ids, backprop_depth=k, generator=gen)
        out.loss.backward()
        clip_grads_(params, 1.0, global_grad_norm(params))
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out

warm = TrainConfig.from_dict(json.loads(sys.argv[1]))
warm.data.block_size, warm.train.micro_batch_size = 16, 1
steps(warm, 1)  # load kernels and thread pools before the baseline
growth = []
for raw in sys.argv[1:]:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS
    base = rss("VmRSS:")
    steps(TrainConfig.from_dict(json.loads(raw)), 2)
    growth.append(rss("VmHWM:") - base)
print(json.dumps(growth))
"""


def small_config(checkpointing: bool) -> dict:
    return {
        "model": {
            "preset": "small",
            "overrides": {"mean_recurrence": 6, "mean_backprop_depth": 4},
        },
        "data": {"vocab_size": 4096, "block_size": 128},
        "train": {
            "micro_batch_size": 4,
            "activation_checkpointing": checkpointing,
            "precision": "fp32",
            "device": "cpu",
        },
    }


def test_plan_matches_measured_cpu_peak():
    """Two steps of a 4.4M-parameter model on 512 tokens, with and without checkpointing: the peak
    RSS growth of a fresh process (glibc returning every large buffer to the OS) against the plan."""
    raws = [small_config(False), small_config(True)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MALLOC_MMAP_THRESHOLD_": "65536",  # large buffers go back to the OS when freed
        "PYTHONPATH": str(REPO),
    }
    res = subprocess.run(
        [sys.executable, "-c", MEASURE, *map(json.dumps, raws)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    measured = json.loads(res.stdout.strip().splitlines()[-1])
    cpu = resolve_device("cpu")
    plans = [plan_memory(TrainConfig.from_dict(raw), cpu, 1, 1) for raw in raws]
    assert not cpu.accelerator and plans[0].strategy == "ddp"
    predicted = [p.total_bytes for p in plans]
    assert predicted[0] > 1.5 * predicted[1]  # checkpointing matters at this size
    for got, want in zip(measured, predicted):
        assert got == pytest.approx(want, rel=0.25), (measured, predicted)


def test_hsdp_is_a_known_strategy_for_the_plan(frontier):
    # the plan covers every strategy the trainer accepts
    from pretrain.strategy import strategy_names

    assert "hsdp" in strategy_names()
    plans = plan_all(frontier, DEVICES["mi250x"], 2, 8)
    assert tuple(plans) == strategy_names() == ("ddp", "bucketed", "fsdp", "hsdp")
