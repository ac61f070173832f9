"""``python -m workbench.corpus run --model M --data D --out DIR [...]`` and
``python -m workbench.corpus summary DIR``, ``python -m workbench.corpus compare RUN_A RUN_B [...]``:
the corpus engine's command line (docs/corpus.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_CLUSTER = "pretrain/configs/huginn-3.5b-frontier.yaml"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workbench.corpus", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="analyse a dataset into DIR (resumable)")
    run.add_argument(
        "--model", default="checkpoints/default", help="checkpoint directory or hub id"
    )
    run.add_argument("--data", default="heldout", help="text/JSONL/CSV/Parquet file, held-out set "
                     "names (heldout, or code,prose,plain_prose,arithmetic,depth) or a datasets name")  # fmt: skip
    run.add_argument("--out", required=True, help="result directory (a relaunch resumes it)")
    run.add_argument("--column", default=None, help="the text column of a table or dataset")
    run.add_argument("--split", default="train", help="the split of a datasets name")
    run.add_argument("--per-source", type=int, default=50, help="prompts per held-out set")
    run.add_argument(
        "--analyses", default="dynamics", help="comma list of dynamics,lens,seeds,stability"
    )
    run.add_argument("--num-steps", type=int, default=None, help="core iterations (default 4r̄)")
    run.add_argument("--seeds", default="0", help="comma list of s_0 seeds, e.g. 0,1,2")
    run.add_argument("--init-scale", type=float, default=1.0, help="scale of the random s_0")
    run.add_argument("--lens-steps", default=None, help="comma list of steps for the lens columns")
    run.add_argument("--max-tokens", type=int, default=None, help="cut every prompt to N tokens")
    run.add_argument("--unit-tokens", type=int, default=2048, help="tokens per work unit")
    run.add_argument(
        "--max-batch-tokens", type=int, default=None, help="cap padded positions per batch"
    )
    run.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 on a GPU)")
    run.add_argument("--nproc", type=int, default=None, help="run N local ranks through torchrun")
    run.add_argument("--slurm-script", action="store_true", help="print a cluster job and exit")
    run.add_argument(
        "--cluster-config", default=DEFAULT_CLUSTER, help="pretraining config naming the cluster"
    )
    summary = sub.add_parser("summary", help="print (and write) the summary of DIR")
    summary.add_argument("out")
    compare = sub.add_parser(
        "compare", help="compare corpus runs: kinds, steps, λ_1, lens KL with bootstrap intervals"
    )
    compare.add_argument(
        "runs", nargs="+", help="corpus run directories; the first is the baseline"
    )
    compare.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap resamples of prompts (default 1000)"
    )
    compare.add_argument("--seed", type=int, default=0, help="seed of the bootstrap draws")
    return p


def int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"error: {flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise SystemExit(f"error: {flag} is empty")
    return values


def slurm_script(args: argparse.Namespace, argv: list[str]) -> str:
    """A job running this command on every rank of the configured cluster."""
    import shlex

    from cluster.config import load_cluster
    from cluster.job_script import job_preamble, rank_step

    cluster = load_cluster(args.cluster_config)
    rest = [a for a in argv if a != "--slurm-script"]
    about = ["# The corpus engine: a relaunch of this script resumes DIR (finished units verify)."]
    lines = job_preamble(cluster, "huginn-corpus", 1, args.out, about)
    command = "python -m workbench.corpus " + " ".join(shlex.quote(a) for a in rest)
    return "\n".join([*lines, *rank_step(cluster, command)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if args.command == "summary":
        from .summary import markdown, write_summary

        print(markdown(write_summary(args.out)), end="")
        return 0
    if args.command == "compare":
        return compare(args)
    seeds = int_list(args.seeds, "--seeds")
    lens_steps = int_list(args.lens_steps, "--lens-steps") if args.lens_steps else None
    if args.slurm_script:
        print(slurm_script(args, argv), end="")
        return 0
    if args.nproc and args.nproc > 1 and "RANK" not in os.environ:
        from cluster.torchrun import relaunch_with_torchrun, strip_nproc

        return relaunch_with_torchrun(args.nproc, strip_nproc(argv), module="workbench.corpus")
    return run(args, seeds, lens_steps)


def run(
    args: argparse.Namespace, seeds: tuple[int, ...], lens_steps: tuple[int, ...] | None
) -> int:
    from .analyses import Settings, default_lens_steps
    from .engine import Job, run_in_process
    from .sources import CorpusError

    analyses = tuple(a.strip() for a in args.analyses.split(",") if a.strip())

    def make_job(model) -> Job:
        steps = args.num_steps or 4 * model.config.mean_recurrence
        lens = lens_steps or (
            default_lens_steps(steps, model.config.mean_recurrence) if "lens" in analyses else ()
        )
        settings = Settings(steps, seeds, analyses, lens, args.init_scale)
        return Job(args.data, settings, args.column, args.split, args.per_source, args.max_tokens,
                   args.unit_tokens, args.max_batch_tokens)  # fmt: skip

    try:
        out = run_in_process(args.model, make_job, Path(args.out), args.dtype)
    except (CorpusError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"corpus: done, results in {out} (summary.md, tokens/)", file=sys.stderr)
    return 0


def compare(args: argparse.Namespace) -> int:
    """Print the comparison of the runs (a run that is not a corpus run: one line, exit 2)."""
    from .compare import compare as compare_runs
    from .compare import format_comparison
    from .sources import CorpusError

    try:
        frames = compare_runs(args.runs, n_boot=args.bootstrap, seed=args.seed)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_comparison(frames), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
