"""A trainer callback for the hang tests of tests/test_train_faults.py (``launch.py --callback
hang_callbacks:stall_rank_1``, with tests/ on PYTHONPATH): at the start of step 2 every rank records
its groups' collective timeouts and its pid, then rank 1 stalls (not in a collective) until the
file OUT/stop-stalling appears or STALL_S seconds pass."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pretrain.callbacks import TrainerCallback
from pretrain.watchdog import collective_timeout


def stall_in_rank_1(out: Path) -> None:
    """Rank 1's stall: the function the stack dumps must name."""
    deadline = time.monotonic() + float(os.environ.get("STALL_S", "60"))
    while time.monotonic() < deadline and not (out / "stop-stalling").exists():
        time.sleep(0.05)


class StallRank1(TrainerCallback):
    def on_step_start(self, trainer) -> None:
        if trainer.step != 1:
            return
        rank, out = trainer.ctx.rank, trainer.out
        timeouts = {
            "default": collective_timeout(),
            "checkpoints": collective_timeout(trainer.checkpoints.group),
        }
        (out / f"timeouts{rank}.json").write_text(json.dumps(timeouts))
        (out / f"step2-rank{rank}").write_text(str(os.getpid()))
        if rank == 1:
            stall_in_rank_1(out)


def stall_rank_1() -> TrainerCallback:
    return StallRank1()
