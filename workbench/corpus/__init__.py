"""The corpus engine: every analysis the app runs on one prompt, over a dataset, on as many ranks as
the user has (torchrun, SLURM), resumable, into one Parquet dataset.

    python -m workbench.corpus run --model checkpoints/default --out runs/corpus
    frame = workbench.corpus.load("runs/corpus")        # one row per (prompt, seed, position)
    tables = workbench.corpus.summary("runs/corpus")    # shares, periods, steps, λ_1 quantiles
    frames = workbench.corpus.compare(["runs/a", "runs/b"])  # differences, bootstrap intervals

See docs/corpus.md.
"""

from .analyses import ANALYSES, Settings
from .compare import compare
from .engine import Job, run, run_in_process
from .heldout import HELDOUT, token_category
from .sources import CorpusError, Prompt, prompt_id, read_prompts
from .store import load, load_prompts, read_manifest
from .summary import summary, write_summary

__all__ = [
    "ANALYSES",
    "HELDOUT",
    "CorpusError",
    "Job",
    "Prompt",
    "Settings",
    "compare",
    "load",
    "load_prompts",
    "prompt_id",
    "read_manifest",
    "read_prompts",
    "run",
    "run_in_process",
    "summary",
    "token_category",
    "write_summary",
]
