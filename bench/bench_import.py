"""What `import recurrent_model` costs beyond `import torch`, in fresh processes, interleaved.

Each round starts one fresh interpreter per source tree with `python -X importtime -c "import
recurrent_model"` and reads the cumulative import time of `torch` and of `recurrent_model` from its
report; the median over rounds is printed per tree, with whether the compiler (`torch._inductor`,
`torch._dynamo`) was imported. `--src` names the trees to compare (default: this checkout), e.g. a
`git archive` of an older commit, so both sides run in the same run under the same load.

    .venv/bin/python bench/bench_import.py [--src DIR ...] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import sys, recurrent_model; "
    "print(sorted(m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules))"
)


def one_import(src: Path) -> tuple[float, float, str]:
    """(seconds for recurrent_model, seconds for torch within it, compiler modules) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE], cwd=src, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    cumulative = {}
    for line in out.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[1].isdigit():
            cumulative[parts[2]] = int(parts[1]) / 1e6
    return cumulative["recurrent_model"], cumulative["torch"], out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, nargs="+", default=[ROOT])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    times: dict[Path, list[tuple[float, float]]] = {src: [] for src in args.src}
    loaded: dict[Path, str] = {}
    for _ in range(args.repeats):
        for src in args.src:
            total, torch_part, loaded[src] = one_import(src)
            times[src].append((total, torch_part))
    print(f"load average {os.getloadavg()[0]:.1f}; median of {args.repeats} fresh imports")
    for src, rows in times.items():
        total = statistics.median(t for t, _ in rows)
        torch_part = statistics.median(t for _, t in rows)
        beyond = statistics.median(t - p for t, p in rows)
        print(f"{src}: import recurrent_model {total:.2f} s (torch {torch_part:.2f} s, beyond "
              f"torch {beyond:.2f} s); compiler modules loaded: {loaded[src]}")  # fmt: skip


if __name__ == "__main__":
    main()
