"""The sbatch script (its pieces, valid bash, and a run against stand-in SLURM commands) and the
non-TTY progress lines."""

import io
import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from pretrain.config import load_config
from pretrain.progress import LogProgress, progress_bar
from pretrain.sbatch import sbatch_script

ROOT = Path(__file__).resolve().parent.parent
FRONTIER = ROOT / "pretrain" / "configs" / "huginn-3.5b-frontier.yaml"


def _script(overrides=None) -> str:
    return sbatch_script(load_config(FRONTIER, overrides), "cfg.yaml", ["train.lr=1e-4"])


def test_script_has_the_cluster_pieces_in_order():
    script = _script()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    pieces = [
        'ulimit -n "$(ulimit -Hn)"',
        "module load rocm",
        'tar -C "$(dirname "$VENV")" -cf',
        'sbcast --force --compress "$VENV_TAR" "$NODE_TMP.venv.tar"',
        "srun -N 512 --ntasks-per-node=1 bash -c node_setup",
        'export PATH="$VIRTUAL_ENV/bin:$PATH"',
        "python pretrain/prepare.py --config cfg.yaml --out runs/huginn-3.5b --set train.lr=1e-4 "
        "--check",
        "srun -N 1 -n 1 -c 56 --kill-on-bad-exit=1",
        "--set train.lr=1e-4 --workers 56",
        "srun -N 512 -n 4096 --ntasks-per-node=8 -c 7 --gpus-per-task=1 --gpu-bind=closest "
        "--kill-on-bad-exit=1 --propagate=NOFILE",
        "python pretrain/launch.py --config cfg.yaml --out runs/huginn-3.5b --set train.lr=1e-4 "
        "--resume",
        'cp -a -u "$TORCHINDUCTOR_CACHE_DIR/." "$RUN_CACHE/inductor/"',
        'srun -N 512 --ntasks-per-node=1 rm -rf "$NODE_TMP"',
    ]
    positions = [script.index(p) for p in pieces]
    assert positions == sorted(positions)
    # the Frontier config puts the venv and the caches on the node's NVMe
    assert "#SBATCH -C nvme" in script
    assert "export NODE_TMP=/mnt/bb/${USER}/huginn-${SLURM_JOB_ID}" in script
    assert 'export TORCHINDUCTOR_CACHE_DIR="/mnt/bb/${USER}/huginn-${SLURM_JOB_ID}/' in script
    assert 'export MIOPEN_USER_DB_PATH="/mnt/bb/${USER}/huginn-${SLURM_JOB_ID}/' in script
    assert 'export VIRTUAL_ENV="$NODE_TMP/.venv"' in script
    without = _script(["cluster.nvme=false"])  # nvme only where the config asks for it
    assert "-C nvme" not in without and "/mnt/bb" not in without
    assert 'export TORCHINDUCTOR_CACHE_DIR="/tmp/huginn-${SLURM_JOB_ID}/' in without
    assert 'export RUN_CACHE="$(realpath -m runs/huginn-3.5b)/cache"' in script
    assert "--workers 8" in _script(["data.workers=8"])


STUBS = {
    # srun: drop its options, run the command once here (one "node")
    "srun": '#!/bin/bash\necho "srun $*" >> "$STUB_LOG"\n'
    "while [[ $# -gt 0 && $1 == -* ]]; do case $1 in -N|-n|-c) shift 2;; *) shift;; esac; done\n"
    'exec "$@"\n',
    "sbcast": '#!/bin/bash\necho "sbcast $*" >> "$STUB_LOG"\ncp "${@: -2:1}" "${@: -1}"\n',
    "scontrol": "#!/bin/bash\necho localhost\n",
    "module": '#!/bin/bash\necho "module $*" >> "$STUB_LOG"\n',
}

# The venv's python: logs how it was called; --check fails once (no data yet); launch writes a
# compile-cache file so the script's save-back step has something to keep.
FAKE_PYTHON = """#!/bin/bash
echo "python $0 $*" >> "$STUB_LOG"
case "$*" in
  *--check*) exit 1 ;;
  *launch.py*) echo kernel > "$TORCHINDUCTOR_CACHE_DIR/compiled-kernel"
    echo "$WANDB_MODE" > "$RUN_OUT/wandb_mode"; echo "$GLOO_SOCKET_IFNAME" > "$RUN_OUT/gloo_ifname" ;;
esac
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("nvme", [False, True])
def test_script_runs_against_stand_in_slurm_commands(tmp_path, nvme):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        _executable(bin_dir / name, text)
    venv = tmp_path / "submit" / "myvenv"
    (venv / "bin").mkdir(parents=True)
    _executable(venv / "bin" / "python", FAKE_PYTHON)
    out = tmp_path / "submit" / "run"
    script = sbatch_script(
        load_config(
            FRONTIER,
            [
                f"cluster.venv={venv}",
                f"cluster.out={out}",
                "cluster.nodes=2",
                "cluster.modules=[m]",
                *(
                    ["cluster.nvme=true", f"cluster.node_local_dir={tmp_path / 'bb'}"]
                    if nvme
                    else ["cluster.nvme=false"]  # the Frontier config asks for the NVMe
                ),
            ],
        ),
        "cfg.yaml",
    )
    assert ("#SBATCH -C nvme" in script) is nvme
    if nvme:  # the stand-in for /mnt/bb/$USER: a node-local directory that exists
        (tmp_path / "bb").mkdir()
    job = str(900_000_000 + uuid.uuid4().int % 99_999_999)  # numeric, like a SLURM job id
    log = tmp_path / "stub.log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "USER": "tester",
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NODELIST": "node[01-02]",
        "SLURM_SUBMIT_DIR": str(tmp_path / "submit"),
        "RUN_OUT": str(out),
    }
    node_tmp = Path(f"{tmp_path / 'bb' if nvme else '/tmp'}/huginn-{job}")  # node-local
    try:
        proc = subprocess.run(
            ["bash", "-c", script, "sbatch"], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        calls = log.read_text().splitlines()
        local_python = f"python {node_tmp}/myvenv/bin/python pretrain/"
        pythons = [c for c in calls if c.startswith("python")]
        # every python ran from the node-local copy: the check (fails: no data), the
        # preparation with one worker per core of a node, then training
        assert [c.split(" --")[0] for c in pythons] == [
            local_python + "prepare.py",
            local_python + "prepare.py",
            local_python + "launch.py",
        ]
        assert pythons[0].endswith("--check") and pythons[1].endswith("--workers 56")
        assert any(c.startswith("sbcast --force --compress") for c in calls)
        assert "srun -N 2 --ntasks-per-node=1 bash -c node_setup" in calls
        assert (out / "cache" / "venv.tar").is_file()
        assert (out / "cache" / "inductor" / "compiled-kernel").read_text() == "kernel\n"
        assert not Path(f"{node_tmp}.venv.tar").exists()  # unpacked on the node, then removed
        assert not node_tmp.exists()  # node-local copies freed at the end
        assert "--gpus-per-task=1 --gpu-bind=closest" in next(c for c in calls if "-n 16" in c)
        assert (out / "wandb_mode").read_text() == "offline\n"
        assert (out / "gloo_ifname").read_text() == "hsn0\n"
    finally:
        shutil.rmtree(node_tmp, ignore_errors=True)


# Progress --------------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_log_progress_writes_periodic_lines():
    stream, clock = io.StringIO(), _Clock()
    bar = LogProgress(total=100, desc="train", every_s=10, stream=stream, clock=clock)
    for step in range(1, 31):
        clock.now = step * 1.0
        bar.update(1)
        bar.set_postfix(loss=f"{1 / step:.3f}")
    bar.write("a message")
    bar.close()
    lines = stream.getvalue().splitlines()
    # the first step, then one line per 10 s (steps 11, 21), the message, and the last step
    assert [line.split(" (")[0] for line in lines] == [
        "train 1/100",
        "train 11/100",
        "train 21/100",
        "a message",
        "train 30/100",
    ]
    assert lines[1] == "train 11/100 (11%) 1 it/s elapsed 00:11 eta 01:29 | loss=0.091"
    assert "\r" not in stream.getvalue()


def test_progress_bar_picks_by_terminal(capsys):
    assert isinstance(progress_bar(total=3, tty=False), LogProgress)
    bar = progress_bar(total=3, tty=True)
    assert not isinstance(bar, LogProgress) and hasattr(bar, "set_postfix")
    bar.close()
    quiet = progress_bar(total=3, tty=False, disable=True)
    quiet.update(3)
    quiet.close()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("every_s", [0.0])
def test_log_progress_without_postfix_logs_on_update(every_s):
    stream = io.StringIO()
    bar = LogProgress(desc="docs", unit="doc", every_s=every_s, stream=stream)
    bar.update(5)
    bar.update(5)
    bar.close()
    assert [line.split(" ")[1] for line in stream.getvalue().splitlines()] == ["5", "10"]
