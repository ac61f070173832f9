"""The optimizer on FSDP2-sharded parameters: 3 gloo ranks shard qk_bias (2 rows) unevenly, one rank
holding an empty shard, and the other tensors unevenly (64 rows over 3 ranks). With the same
gradients, the sharded update must stay finite and equal the single-process update (the update-
clipping RMS is a global sum / global numel, not a mean of local means)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

from pretrain.optimizer import ClippedAtanAdam, parameter_groups
from recurrent_model import RecurrentLM, preset

STEPS = 4


def build():
    torch.manual_seed(0)
    cfg = preset("tiny", n_embd=64, n_heads=4, intermediate_size=176, vocab_size=512)
    model = RecurrentLM(cfg)
    with torch.no_grad():  # non-zero biases, so weight decay and updates touch every tensor
        for name, p in model.named_parameters():
            if name.endswith("qk_bias"):
                p.normal_(0, 0.02)
    return model


def grads_for(model, step):
    # Deterministic per-name gradients; at step 2 one element spikes so update clipping engages.
    out = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        gen = torch.Generator().manual_seed(1000 * step + i)
        g = torch.randn(p.shape, generator=gen) * (0.1 + 0.05 * (i % 5))
        if step == 2:
            g.view(-1)[0] += 50.0
        out[name] = g
    return out


def train(model, shard):
    opt = ClippedAtanAdam(parameter_groups(model, 0.1), lr=1e-2, weight_decay=0.1)
    for step in range(STEPS):
        for name, g in grads_for(model, step).items():
            p = model.get_parameter(name)
            p.grad = distribute_tensor(g, p.device_mesh, p.placements) if shard else g
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        n: (p.full_tensor() if shard else p).detach().clone()
        for n, p in model.named_parameters()
    }


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
model = build()
t = model.transformer
for block in [*t.prelude, *t.core_block, *t.coda]:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
qk = t.core_block[0].attn.qk_bias
local_sizes = [None] * world
dist.all_gather_object(local_sizes, qk.to_local().numel())
sharded = train(model, shard=True)
if rank == 0:
    reference = train(build(), shard=False)
    diff = max(float((sharded[n] - reference[n]).abs().max()) for n in reference)
    moved = min(float((reference[n] - build().get_parameter(n)).abs().max()) for n in reference)
    finite = all(bool(torch.isfinite(v).all()) for v in sharded.values())
    print(json.dumps({"diff": diff, "moved": moved, "finite": finite, "qk_local": local_sizes}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_three_ranks_with_empty_shards_match_one_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=3",
        str(script),
    ]
    res = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads([line for line in res.stdout.splitlines() if line.startswith("{")][-1])
    assert out["qk_local"] == [64, 64, 0]  # qk_bias (2, 1, 4, 16): rows 1, 1, 0 over 3 ranks
    assert out["finite"]
    assert out["moved"] > 1e-4  # every tensor was updated
    assert out["diff"] < 1e-6, out
