"""Training configs, --set overrides, SLURM rank variables, the sbatch script, the Frontier env."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.rocm import frontier_environment, set_frontier_environment
from cluster.slurm import parse_first_host, set_torch_env_from_slurm
from cluster.torchrun import strip_nproc
from pretrain.config import DEFAULT_CONFIG, TrainConfigError, load_config
from pretrain.sbatch import sbatch_script

REPO = Path(__file__).resolve().parent.parent
FRONTIER = REPO / "pretrain" / "configs" / "huginn-3.5b-frontier.yaml"


def test_default_config_is_cpu_tiny_and_overrides_apply():
    config = load_config(
        None, ["train.lr=3e-4", "model.overrides.n_embd=128", "train.val_depths=[1, 2]"]
    )
    assert DEFAULT_CONFIG.name == "cpu-small.yaml"
    assert config.train.lr == 3e-4 and isinstance(config.train.lr, float)
    assert config.model_config().n_embd == 128
    assert config.val_depths() == [1, 2]
    assert config.train.device == "cpu"


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(TrainConfigError, match="train.lrr"):
        load_config(None, ["train.lrr=1"])
    with pytest.raises(TrainConfigError, match="distributed.strategy"):
        load_config(None, ["distributed.strategy=zero3"])
    with pytest.raises(TrainConfigError, match="train.max_steps"):
        load_config(None, ["train.max_steps=2.5"])
    with pytest.raises(TrainConfigError, match="key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(TrainConfigError, match="cluster.wandb_mode='offlin'"):
        load_config(None, ["cluster.wandb_mode=offlin"])
    with pytest.raises(TrainConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_frontier_config_reproduces_the_published_run():
    config = load_config(FRONTIER)
    m = config.model_config()
    assert (m.n_layers_in_prelude, m.n_layers_in_recurrent_block, m.n_layers_in_coda) == (2, 4, 2)
    assert (m.n_embd, m.vocab_size, m.block_size) == (5280, 65536, 4096)
    assert (m.mean_recurrence, config.backprop_depth) == (32, 8)
    t = config.train
    assert (t.lr, t.warmup_steps, t.micro_batch_size, t.grad_accum) == (4e-5, 4096, 1, 1)
    assert (config.cluster.nodes, config.cluster.gpus_per_node) == (512, 8)
    # hsdp: the memory plan's choice (tests/test_plan.py); the recipe's 64 MiB buckets stay set
    assert config.distributed.strategy == "hsdp" and config.distributed.bucket_mb == 64


def test_slurm_script_is_complete():
    script = sbatch_script(load_config(FRONTIER), "cfg.yaml", ["train.lr=1e-4"])
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=512" in script and "#SBATCH --signal=USR1@300" in script
    assert "#SBATCH --array=1-8%1" in script
    assert (
        "srun -N 512 -n 4096 --ntasks-per-node=8 -c 7 --gpus-per-task=1 --gpu-bind=closest"
        in script
    )
    assert "#SBATCH -C nvme" in script  # the Frontier config asks for the node-local NVMe
    assert "--resume" in script and "--set train.lr=1e-4" in script
    for module in ("PrgEnv-gnu", "rocm", "craype-accel-amd-gfx90a"):
        assert f"module load {module}" in script
    for var in (
        'NCCL_SOCKET_IFNAME="hsn"',
        'GLOO_SOCKET_IFNAME="hsn0"',
        'WANDB_MODE="${WANDB_MODE:-offline}"',
        'NCCL_NET_GDR_LEVEL="3"',
        'FI_CXI_ATS="0"',
        'TORCHINDUCTOR_CACHE_DIR="/mnt/bb/${USER}/',
        'MIOPEN_USER_DB_PATH="/mnt/bb/${USER}/',
        "TORCH_NCCL_TRACE_BUFFER_SIZE=2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
        'TORCH_FR_DUMP_TEMP_FILE="$(realpath -m runs/huginn-3.5b)/stacks/nccl_trace_rank_"',
    ):
        assert f"export {var}" in script
    assert script.index("TORCH_NCCL_DUMP_ON_TIMEOUT") < script.index("python pretrain/launch.py")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_launch_prints_the_slurm_script_without_training():
    proc = subprocess.run(
        [
            sys.executable,
            "pretrain/launch.py",
            "--config",
            str(FRONTIER),
            "--slurm-script",
            "--set",
            "cluster.nodes=2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "srun -N 2 -n 16 --ntasks-per-node=8" in proc.stdout


def test_ranks_from_slurm_variables():
    env = {
        "SLURM_PROCID": "11",
        "SLURM_LOCALID": "3",
        "SLURM_NTASKS": "16",
        "SLURM_JOB_NODELIST": "frontier[00012-00013]",
        "SLURM_JOB_ID": "123",
    }
    got = set_torch_env_from_slurm(env)
    assert got["RANK"] == "11" and got["LOCAL_RANK"] == "3" and got["WORLD_SIZE"] == "16"
    assert got["MASTER_ADDR"] == "frontier00012"
    assert got["MASTER_PORT"] == str(29500 + 123)


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("frontier00042", "frontier00042"),
        ("frontier[00007,00009-00011]", "frontier00007"),
        ("nid[001-004],login1", "nid001"),
        ("a1,b2", "a1"),
    ],
)
def test_first_host_parsing(nodelist, first):
    assert parse_first_host(nodelist) == first


def test_frontier_environment_and_gdr_switch():
    env = frontier_environment()
    assert env["NCCL_NET_GDR_LEVEL"] == "3" and env["NCCL_CROSS_NIC"] == "1"
    assert env["HSA_FORCE_FINE_GRAIN_PCIE"] == "1" and env["MPICH_GPU_SUPPORT_ENABLED"] == "0"
    assert "NCCL_NET_GDR_LEVEL" not in frontier_environment(gdr=False)
    target = {"USER": "me", "LD_LIBRARY_PATH": "/opt/lib", "NCCL_SOCKET_IFNAME": "eth0"}
    set_frontier_environment(target, ofi_rccl_lib="/ofi")
    assert target["LD_LIBRARY_PATH"] == "/ofi:/opt/lib"
    assert target["NCCL_SOCKET_IFNAME"] == "eth0"  # the user's own setting wins
    assert target["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor-me"


def test_strip_nproc():
    assert strip_nproc(["--nproc", "2", "--out", "x", "--nproc=3"]) == ["--out", "x"]


def test_collective_timeouts_are_configured_and_checked():
    d = load_config(None).distributed
    assert d.timeout_minutes * 60 > d.step_timeout_s > 0 and d.stop_grace_s > 0
    for bad in ("step_timeout_s=0", "stop_grace_s=-1", "timeout_minutes=0"):
        with pytest.raises(TrainConfigError, match="distributed.step_timeout_s"):
            load_config(None, [f"distributed.{bad}"])


def test_the_flight_recorder_is_set_for_nccl_unless_the_user_set_it(tmp_path):
    from cluster.flight_recorder import enable_flight_recorder

    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    enable_flight_recorder(tmp_path / "run", environ)
    assert environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"  # the user's value stays
    assert environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    prefix = str((tmp_path / "run" / "stacks" / "nccl_trace_rank_").resolve())
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    assert (tmp_path / "run" / "stacks").is_dir()


def test_the_trainers_cpu_peak_is_the_f_linear_probe_at_the_models_shapes(monkeypatch):
    import torch

    from pretrain.metrics import peak_flops
    from recurrent_model import speed

    monkeypatch.delenv("PRETRAIN_PEAK_FLOPS", raising=False)
    config = load_config(None).model_config()
    peak, source = peak_flops(torch.device("cpu"), False, config, rows=64)
    probe = speed.linear_speed(config=config, device="cpu", dtype="float32", rows=64)
    assert peak == probe.flops_per_second  # the same measurement, held by the probe
    assert "F.linear, float32, cpu, 64 rows" in source and source.startswith("measured")
    shapes = set(config.cost.block_shapes().values())
    assert probe.shapes and all(
        any(o <= s_o and i == s_i for s_o, s_i in shapes) for o, i in probe.shapes
    )
