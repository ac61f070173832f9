"""The embedded starter corpus: Python standard-library source plus generated reasoning data.

Nothing is downloaded: the code comes from the running interpreter's ``Lib`` directory (a seeded subset
chosen by size), the reasoning data from the generators in ``tasks.arithmetic``, ``tasks.depth`` (tasks
whose number of sequential steps is controlled, trained levels and train split only) and
``tasks.reasoning``. A quarter of the arithmetic and word-problem documents are rendered with the
Huginn chat template (without the leading BOS, which the packer adds to every document).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from recurrent_model.tokenizer import ASSISTANT_ROLE, BEGIN_HEADER, END_HEADER, END_TURN
from tasks import arithmetic, depth, reasoning

from .config import STARTER, DataError
from .readers import Document, decode_utf8


@dataclass(frozen=True)
class StarterSize:
    stdlib_bytes: int | None  # None: every eligible file
    reasoning_docs: int


SIZES = {
    "tiny": StarterSize(stdlib_bytes=120_000, reasoning_docs=600),
    "small": StarterSize(stdlib_bytes=1_500_000, reasoning_docs=16_000),
    "medium": StarterSize(stdlib_bytes=None, reasoning_docs=30_000),
    "full": StarterSize(stdlib_bytes=None, reasoning_docs=300_000),
}
MAX_FILE_BYTES = 150_000
CHUNK_CHARS = 1_000
CHAT_PROBABILITY = 0.25
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "_bundled"}
_EXCLUDED_PREFIXES = (".", "config-")
_TOP_LEVEL = re.compile(r"^(?:@|def |async def |class )")
_METHOD = re.compile(r"^    (?:@|def |async def )")


def stdlib_directory() -> Path:
    """The standard library of the running interpreter."""
    path = Path(sysconfig.get_paths()["stdlib"])
    if not (path / "os.py").is_file():
        raise DataError(f"the Python standard library was not found at {path}")
    return path


def stdlib_files(seed: int, budget: int | None) -> list[tuple[str, Path]]:
    """A seeded subset of ``.py`` files (tests excluded, each under MAX_FILE_BYTES) within ``budget``."""
    root = stdlib_directory()
    candidates = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if d not in _EXCLUDED_DIRS and not d.startswith(_EXCLUDED_PREFIXES)
        )
        for name in names:
            path = Path(dirpath) / name
            if name.endswith(".py") and path.stat().st_size <= MAX_FILE_BYTES:
                candidates.append((path.relative_to(root).as_posix(), path))
    candidates.sort(key=lambda c: hashlib.sha256(f"{seed}:{c[0]}".encode()).hexdigest())
    chosen, total = [], 0
    for rel, path in candidates:
        size = path.stat().st_size
        if budget is not None and total + size > budget:
            continue
        chosen.append((rel, path))
        total += size
    return chosen


def _split_at(lines: list[str], boundary: re.Pattern) -> list[list[str]]:
    """Split lines where ``boundary`` matches, keeping decorators with what they decorate."""
    pieces: list[list[str]] = [[]]
    previous = ""
    for line in lines:
        if boundary.match(line) and not previous.lstrip().startswith("@") and pieces[-1]:
            pieces.append([])
        pieces[-1].append(line)
        if line.strip():
            previous = line
    return pieces


def split_source(text: str, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Split Python source at top-level definitions (long classes at their methods), regrouping
    consecutive pieces up to ``max_chars``."""
    pieces = []
    for piece in _split_at(text.splitlines(keepends=True), _TOP_LEVEL):
        if sum(map(len, piece)) > max_chars:
            pieces.extend("".join(p) for p in _split_at(piece, _METHOD))
        else:
            pieces.append("".join(piece))
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + len(piece) <= max_chars:
            chunks[-1] += piece
        else:
            chunks.append(piece)
    return [c for c in chunks if c.strip()]


def stdlib_documents(seed: int, budget: int | None) -> list[Document]:
    docs = []
    for rel, path in stdlib_files(seed, budget):
        text, _ = decode_utf8(path.read_bytes())
        for chunk in split_source(text):
            docs.append(Document(f"# Lib/{rel}\n{chunk}", STARTER, "stdlib"))
    return docs


def render_chat(question: str, answer: str) -> str:
    """The chat template for one user turn and one assistant turn, without the leading BOS."""
    return (
        f"{BEGIN_HEADER}user{END_HEADER}\n\n{question.strip()}{END_TURN}"
        f"{BEGIN_HEADER}{ASSISTANT_ROLE}{END_HEADER}\n\n{answer.strip()}{END_TURN}"
    )


def _arithmetic_doc(rng: random.Random) -> Document:
    difficulty = min(rng.randint(1, 6), rng.randint(1, 6))  # more easy than hard problems
    problems = arithmetic.make_problems(
        rng.randint(4, 12), difficulty, rng.getrandbits(48), split="train"
    )
    if rng.random() < CHAT_PROBABILITY:
        prompt, answer = problems[0]
        text = render_chat(
            f"What is {prompt.removesuffix(' =')}?", arithmetic.render(prompt, answer)
        )
        return Document(text, STARTER, "chat")
    return Document("\n".join(arithmetic.render(p, a) for p, a in problems), STARTER, "arithmetic")


def _task_doc(rng: random.Random, kind: str, generators: tuple) -> Document:
    if rng.random() < CHAT_PROBABILITY:
        return Document(render_chat(*rng.choice(generators)(rng)), STARTER, "chat")
    tasks = [rng.choice(generators)(rng) for _ in range(rng.randint(1, 3))]
    return Document("\n\n".join(f"Question: {q}\nAnswer: {a}" for q, a in tasks), STARTER, kind)


def _depth_doc(rng: random.Random) -> Document:
    """2-6 train-split depth tasks of one kind at trained levels, one after another."""
    kind = rng.choice(depth.KINDS)
    tasks = [
        depth.make_tasks(kind, 1, depth.training_level(rng, kind), rng.getrandbits(48), "train")[0]
        for _ in range(rng.randint(2, 6))
    ]
    return Document("\n\n".join(t.render() for t in tasks), STARTER, f"depth_{kind}")


def reasoning_documents(n: int, seed: int) -> list[Document]:
    """``n`` generated documents: 30% arithmetic, 35% depth tasks, 15% word problems, 10% counting,
    10% modular."""
    rng = random.Random(f"reasoning:{seed}")
    docs = []
    for _ in range(n):
        pick = rng.random()
        if pick < 0.30:
            docs.append(_arithmetic_doc(rng))
        elif pick < 0.65:
            docs.append(_depth_doc(rng))
        elif pick < 0.80:
            docs.append(_task_doc(rng, "word_problems", reasoning.WORD_PROBLEMS))
        elif pick < 0.90:
            docs.append(_task_doc(rng, "counting", reasoning.COUNTING))
        else:
            docs.append(_task_doc(rng, "modular", reasoning.MODULAR))
    return docs


def starter_documents(size: str, seed: int) -> list[Document]:
    """The whole starter corpus for ``size`` ("tiny", "small", "medium", "full"), shuffled by ``seed``."""
    if size not in SIZES:
        raise DataError(f"starter size must be one of {', '.join(SIZES)}, got {size!r}")
    spec = SIZES[size]
    docs = stdlib_documents(seed, spec.stdlib_bytes) + reasoning_documents(
        spec.reasoning_docs, seed
    )
    random.Random(f"starter:{seed}").shuffle(docs)
    return docs
