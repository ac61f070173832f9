"""Prepare a run's data before the training job: ``python pretrain/prepare.py [--config FILE]
[--set k=v ...] [--out DIR] [--workers N] [--check] [--verify]``.

Reads the same config, ``--set`` overrides and ``--out`` as ``pretrain/launch.py`` and writes the
tokenizer, the packed shards and their manifest where the training job looks for them
(``data.cache_dir``, else ``OUT/data``). Tokenization runs in ``--workers`` processes (default
``data.workers``); the shards do not depend on the number. A second run with an unchanged config and
corpus reuses the build. ``--check`` only tells (exit 0 or 1) whether current prepared data exists,
from the manifest alone; ``--verify`` also re-hashes every shard against the manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pretrain.config import (  # noqa: E402
    TrainConfigError,
    add_config_arguments,
    load_config,
    run_directory,
)
from pretrain.data import DataError, load_prepared, prepare_data  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pretrain/prepare.py", description=__doc__.split("\n\n")[0])
    add_config_arguments(p)
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (data.workers)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 0 if prepared data for this config exists (manifest only), else 1",
    )
    mode.add_argument(
        "--verify", action="store_true", help="re-hash the prepared files against the manifest"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config, args.overrides, args.init_from)
    except TrainConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = run_directory(args.out, args.config)
    directory = config.data.directory(out)
    data = config.data.data_config()
    workers = args.workers if args.workers is not None else config.data.workers
    if workers < 1:
        print(f"error: --workers must be >= 1, got {workers}", file=sys.stderr)
        return 2
    try:
        if args.check or args.verify:
            prepared = load_prepared(directory, data, verify=args.verify)
        else:
            progress = config.train.progress
            prepared = prepare_data(data, directory, progress=progress, workers=workers)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = json.loads(prepared.summary())
    summary["directory"] = os.fspath(directory)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
