"""``prepare_data``: corpus → tokenizer → packed train/val shards with a manifest, built once.

Layout of ``out_dir``: ``manifest.json`` (written last, by an atomic rename) names the build directory
``build-<key>/`` holding ``tokenizer.json`` and ``train-00000.npy``, ``val-00000.npy``, … (uint16 rows
of ``block_size + 1`` ids, uint32 above 65,536 ids). The manifest records the data config, the SHA-256
and size of every file, token counts per split and document/token counts per source.

The build streams: documents are read one at a time, tokenized in ``workers`` processes (results in
corpus order, so 1 and N workers give byte-identical shards) and packed into shards written one by
one; the corpus is never held in memory. The build key hashes the config and the sources' file
metadata (paths, sizes, mtimes; the generating code for the starter corpus), so deciding that an
existing build is current reads no corpus text. The training job goes further: :func:`load_prepared`
only reads the manifest, checks the config and file sizes, and the loader memory-maps the shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

from recurrent_model.atomic_io import atomic_write_text, replace_durably
from recurrent_model.tokenizer import HuginnTokenizer, TokenizerError

from ..progress import progress_bar
from .config import STARTER, DataConfig, DataError, PreparedData
from .encoding import encode_batches
from .packing import Packer, ShardWriter, file_sha256, row_dtype
from .readers import Document, ReadStats, read_source, source_fingerprint
from .starter_corpus import starter_documents
from .tokenizer_training import check_special_ids, train_tokenizer

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
TOKENIZER_TRAIN_BYTES = 256 * 2**20
BATCH_DOCS = 1024  # documents per tokenization task
BATCH_BYTES = 4 * 2**20  # or fewer, when they are long
PREPARE_HINT = "run `python pretrain/prepare.py` with the training job's --config and --set first"
log = logging.getLogger(__name__)


class Corpus:
    """The configured sources as a re-iterable stream of documents (the starter is cached)."""

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self._starter: list[Document] | None = None

    def _source(self, source: str, stats: ReadStats) -> Iterator[Document]:
        if source == STARTER:
            if self._starter is None:
                self._starter = starter_documents(self.config.starter_size, self.config.seed)
            return iter(self._starter)
        return read_source(source, self.config.seed, self.config.invalid_utf8, stats)

    def documents(self, stats: ReadStats | None = None, digest: Any = None) -> Iterator[Document]:
        """Every non-empty document, source by source; fed to ``digest`` (a hashlib object) if given."""
        stats = stats if stats is not None else ReadStats()
        for source in self.config.sources:
            before = stats.docs_per_source[source]
            for doc in self._source(source, stats):
                if not doc.text:
                    stats.empty_documents_skipped += 1
                    continue
                stats.docs_per_source[source] += 1
                stats.docs_per_kind[f"{source}:{doc.kind}"] += 1
                stats.bytes_per_source[source] += len(doc.text.encode("utf-8", "surrogatepass"))
                if digest is not None:
                    hash_document(digest, doc)
                yield doc
            if stats.docs_per_source[source] == before:
                raise DataError(f"corpus source {source!r} has no documents: the corpus is empty")

    def is_keep_all(self, doc: Document) -> bool:
        keep = self.config.keep_all_sources
        return doc.source in keep or f"{doc.source}:{doc.kind}" in keep


def hash_document(digest: Any, doc: Document) -> None:
    """Feed one document (source, kind, text; each length-prefixed) to a hashlib object."""
    for part in (doc.source, doc.kind, doc.text):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)


def corpus_hash(corpus: Corpus, stats: ReadStats, progress: bool = False) -> str:
    """SHA-256 over every document's source, kind and text, in corpus order (one full read)."""
    digest = hashlib.sha256()
    bar = progress_bar(desc="reading corpus", unit="doc", disable=not progress)
    for _ in corpus.documents(stats, digest):
        bar.update(1)
    bar.close()
    return digest.hexdigest()


def _in_repository(path: Path, repo: Path) -> bool:
    path = path.resolve()
    if not path.is_relative_to(repo):
        return False
    parts = path.relative_to(repo).parts
    return not any(p.startswith(".") or p == "site-packages" for p in parts)


def _repository_modules(roots: list[ModuleType], repo: Path) -> list[Path]:
    """Source files of ``roots`` and every repository module they reach through their globals
    (imported modules, and the modules of imported functions and classes)."""
    seen: dict[str, Path] = {}
    stack = list(roots)
    while stack:
        module = stack.pop()
        file = getattr(module, "__file__", None)
        if module.__name__ in seen or file is None or not _in_repository(Path(file), repo):
            continue
        seen[module.__name__] = Path(file)
        for value in vars(module).values():
            target = value if isinstance(value, ModuleType) else None
            owner = getattr(value, "__module__", None)
            if target is None and isinstance(owner, str) and owner in sys.modules:
                target = sys.modules[owner]
            if target is not None and target.__name__ not in seen:
                stack.append(target)
    return [seen[name] for name in sorted(seen)]


def _starter_code_hash() -> str:
    """The code that generates the starter corpus and the Python version (the stdlib part of the
    corpus comes from the running interpreter), so a changed generator gives a new build."""
    from recurrent_model import tokenizer  # the chat-template strings in the documents

    from . import starter_corpus

    repo = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(sys.version.encode())
    for path in _repository_modules([starter_corpus, tokenizer], repo):
        digest.update(str(path.resolve().relative_to(repo)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def corpus_fingerprint(config: DataConfig) -> dict[str, Any]:
    """What the build depends on, per source, without reading any corpus text."""
    out: dict[str, Any] = {}
    for source in config.sources:
        if source == STARTER:
            out[source] = {"starter": config.starter_size, "code": _starter_code_hash()}
        else:
            out[source] = source_fingerprint(source)
    return out


def _tokenizer_file(config: DataConfig) -> Path | None:
    if config.tokenizer_path is None:
        return None
    path = Path(config.tokenizer_path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"tokenizer_path {config.tokenizer_path} has no tokenizer.json")
    return path


def build_key(config: DataConfig, fingerprint: dict[str, Any]) -> str:
    tokenizer = _tokenizer_file(config)
    payload = {
        "format": FORMAT_VERSION,
        "config": asdict(config),
        "sources": fingerprint,
        "tokenizer": file_sha256(tokenizer) if tokenizer is not None else None,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _load_tokenizer(config: DataConfig, corpus: Corpus, out_path: Path, progress: bool):
    if config.tokenizer_path is not None:
        try:
            tokenizer = HuginnTokenizer.from_file(config.tokenizer_path)
        except TokenizerError as exc:
            raise DataError(str(exc)) from exc
        check_special_ids(tokenizer.backend, config.vocab_size)
        tokenizer.save(out_path)
        return tokenizer

    def texts() -> Iterator[str]:
        budget = TOKENIZER_TRAIN_BYTES
        for doc in corpus.documents():
            yield doc.text
            budget -= len(doc.text)
            if budget <= 0:
                return

    if progress:
        print(f"training a {config.vocab_size}-token byte-level BPE tokenizer", flush=True)
    show = progress and sys.stdout.isatty()  # tokenizers' own bar: blank lines in a log file
    return train_tokenizer(texts(), config.vocab_size, out_path, show_progress=show)


class Mixture:
    """How many copies of each document the mixture weights ask for (seeded per source, so one
    source's draws do not depend on the others)."""

    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self._rngs: dict[str, random.Random] = {}

    def copies(self, source: str) -> int:
        weight = self.config.weight(source)
        whole = int(weight)
        fraction = weight - whole
        if fraction == 0:
            return whole
        rng = self._rngs.get(source)
        if rng is None:
            rng = self._rngs[source] = random.Random(f"mix:{self.config.seed}:{source}")
        return whole + (rng.random() < fraction)


def _batches(
    config: DataConfig, corpus: Corpus, stats: ReadStats, digest: Any
) -> Iterator[tuple[list[tuple[str, bool, str, int]], list[str]]]:
    """``(meta, texts)`` batches for the tokenizer; meta is (source, keep_all, split, copies).

    Split and copies are drawn here, in corpus order, so they do not depend on the workers."""
    split_rng = random.Random(f"split:{config.seed}")
    mixture = Mixture(config)
    meta: list[tuple[str, bool, str, int]] = []
    texts: list[str] = []
    size = 0
    for doc in corpus.documents(stats, digest):
        split = "val" if split_rng.random() < config.val_fraction else "train"
        copies = mixture.copies(doc.source)
        if copies == 0:
            continue
        meta.append((doc.source, corpus.is_keep_all(doc), split, copies))
        texts.append(doc.text)
        size += len(doc.text)
        if len(texts) >= BATCH_DOCS or size >= BATCH_BYTES:
            yield meta, texts
            meta, texts, size = [], [], 0
    if texts:
        yield meta, texts


def _pack_splits(
    config: DataConfig,
    corpus: Corpus,
    tokenizer: HuginnTokenizer,
    tokenizer_path: Path,
    build: Path,
    progress: bool,
    workers: int = 1,
) -> tuple[dict[str, list[list]], dict[str, Any], str]:
    """Tokenize, split, weight, pack and write both splits; returns (shards, stats, corpus hash)."""
    row_length = config.block_size + 1
    dtype = row_dtype(config.vocab_size)
    packers = {s: Packer(row_length, tokenizer.bos_id, tokenizer.eos_id) for s in ("train", "val")}
    writers = {s: ShardWriter(build, s, row_length, dtype) for s in ("train", "val")}
    tokens = {"train": 0, "val": 0}
    emitted_docs: Counter = Counter()
    emitted_tokens: Counter = Counter()
    stats = ReadStats()
    digest = hashlib.sha256()
    bar = progress_bar(desc="tokenizing and packing", unit="doc", disable=not progress)
    batches = _batches(config, corpus, stats, digest)
    for meta, encoded in encode_batches(str(tokenizer_path), batches, workers):
        for (source, keep_all, split, copies), ids in zip(meta, encoded):
            for _ in range(copies):
                tokens[split] += len(ids) + 2
                emitted_docs[source] += 1
                emitted_tokens[source] += len(ids) + 2
                for row in packers[split].add(ids, keep_all):
                    writers[split].write(row)
        bar.update(len(meta))
    bar.close()
    shards, token_stats = {}, {}
    for split in ("train", "val"):
        packers[split].finish()
        shards[split] = writers[split].close()
        token_stats[split] = {
            "documents": packers[split].documents,
            "tokens": tokens[split],
            "tokens_in_rows": writers[split].total_rows * row_length,
            "tokens_dropped": packers[split].dropped_tokens,
        }
    _warn_invalid_utf8(stats)
    sources = {
        source: {
            "weight": config.weight(source),
            "documents_read": stats.docs_per_source[source],
            "bytes_read": stats.bytes_per_source[source],
            "documents_emitted": emitted_docs[source],
            "tokens_emitted": emitted_tokens[source],
        }
        for source in config.sources
    }
    return (
        shards,
        {**stats.as_dict(), "tokens": token_stats, "sources": sources},
        digest.hexdigest(),
    )


def prepare_data(
    config: DataConfig, out_dir: str | Path, progress: bool = True, workers: int = 1
) -> PreparedData:
    """Build (or reuse) the tokenizer and packed shards for ``config`` under ``out_dir``.

    ``workers`` tokenizer processes (the shards do not depend on it). Reuse is decided from the
    config and the sources' file metadata; a changed config or corpus builds anew, atomically.
    """
    config.validate()
    if workers < 1:
        raise DataError(f"workers must be >= 1, got {workers}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = corpus_fingerprint(config)
    key = build_key(config, fingerprint)
    existing = _reusable(out_dir, key)
    if existing is not None:
        if progress:
            print(f"reusing prepared data in {out_dir} ({existing.summary()})", flush=True)
        return existing

    corpus = Corpus(config)
    build_name = f"build-{key[:16]}"
    tmp = out_dir / f".tmp-{build_name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tokenizer = _load_tokenizer(config, corpus, tmp / "tokenizer.json", progress)
        shards, stats, digest = _pack_splits(
            config, corpus, tokenizer, tmp / "tokenizer.json", tmp, progress, workers
        )
        shards = {s: [[f"{build_name}/{e[0]}", *e[1:]] for e in v] for s, v in shards.items()}
        prepared = PreparedData(
            directory=out_dir,
            tokenizer_path=out_dir / build_name / "tokenizer.json",
            corpus_hash=digest,
            train_rows=sum(e[1] for e in shards["train"]),
            val_rows=sum(e[1] for e in shards["val"]),
            block_size=config.block_size,
            vocab_size=config.vocab_size,
            stats=stats,
            shards=shards,
        )
        _check_rows(prepared, config)
        tokenizer_sha = file_sha256(tmp / "tokenizer.json")
        final = out_dir / build_name
        shutil.rmtree(final, ignore_errors=True)
        replace_durably(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_manifest(out_dir, key, config, fingerprint, tokenizer_sha, prepared)
    _prune(out_dir, keep=build_name)
    if progress:
        print(f"prepared data in {out_dir}: {prepared.summary()}", flush=True)
    return prepared


def _check_rows(prepared: PreparedData, config: DataConfig) -> None:
    if prepared.train_rows == 0:
        raise DataError(
            f"the corpus gave no training row of block_size + 1 = {config.block_size + 1} tokens: "
            "add data or lower block_size"
        )
    if config.val_fraction > 0 and prepared.val_rows == 0:
        raise DataError(
            f"val_fraction {config.val_fraction} gave no validation row: add data, raise "
            "val_fraction or lower block_size"
        )


def _warn_invalid_utf8(stats: ReadStats) -> None:
    if stats.invalid_utf8_files:
        log.warning(
            "invalid UTF-8 in %d file(s): %d byte(s) replaced, %d document(s) skipped",
            stats.invalid_utf8_files,
            stats.invalid_utf8_bytes_replaced,
            stats.invalid_utf8_skipped,
        )


def _write_manifest(
    out_dir: Path,
    key: str,
    config: DataConfig,
    fingerprint: dict[str, Any],
    tokenizer_sha: str,
    prepared: PreparedData,
) -> None:
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "config": asdict(config),
        "sources": fingerprint,
        "tokenizer_sha256": tokenizer_sha,
        "prepared": prepared.to_json(),
    }
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1))


def _prune(out_dir: Path, keep: str) -> None:
    for path in out_dir.glob("build-*"):
        if path.name != keep and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def read_manifest(out_dir: str | Path) -> dict[str, Any]:
    """The parsed manifest of ``out_dir``; a clear :class:`DataError` when missing or corrupted."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise DataError(f"no prepared data in {out_dir} ({MANIFEST} missing): {PREPARE_HINT}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is corrupted ({exc}): {PREPARE_HINT}") from exc
    if not isinstance(manifest, dict):
        raise DataError(f"{path} is corrupted (not a JSON object): {PREPARE_HINT}")
    if manifest.get("format") != FORMAT_VERSION:
        raise DataError(
            f"{path} has format {manifest.get('format')}, expected {FORMAT_VERSION}: {PREPARE_HINT}"
        )
    missing = [k for k in ("key", "config", "prepared", "tokenizer_sha256") if k not in manifest]
    if missing:
        raise DataError(f"{path} is corrupted (missing {', '.join(missing)}): {PREPARE_HINT}")
    return manifest


def _prepared_from(out_dir: Path, manifest: dict[str, Any]) -> PreparedData:
    try:
        prepared = PreparedData.from_json(out_dir, manifest["prepared"])
        files = [
            (prepared.directory / entry[0], int(entry[2]), str(entry[3]))
            for split in ("train", "val")
            for entry in prepared.shards[split]
        ]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DataError(
            f"{out_dir / MANIFEST} is corrupted ({type(exc).__name__}: {exc}): {PREPARE_HINT}"
        ) from exc
    for path, size, _ in files:
        if not path.is_file():
            raise DataError(
                f"shard {path} named in {out_dir / MANIFEST} is missing: {PREPARE_HINT}"
            )
        if path.stat().st_size != size:
            raise DataError(
                f"shard {path} has {path.stat().st_size} bytes, the manifest says {size}: "
                f"{PREPARE_HINT}"
            )
    if not prepared.tokenizer_path.is_file():
        raise DataError(f"tokenizer {prepared.tokenizer_path} is missing: {PREPARE_HINT}")
    return prepared


def _config_differences(config: DataConfig, recorded: dict[str, Any]) -> list[str]:
    wanted = json.loads(json.dumps(asdict(config)))
    return sorted(k for k in set(wanted) | set(recorded) if wanted.get(k) != recorded.get(k))


def load_prepared(
    out_dir: str | Path, config: DataConfig | None = None, verify: bool = False
) -> PreparedData:
    """The data :func:`prepare_data` built under ``out_dir``, from its manifest alone.

    Checks the format, that every file is there with its recorded size and, given ``config``, that
    the data was built for that config. ``verify`` also re-hashes the shards and the tokenizer.
    No corpus file is read.
    """
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    if config is not None:
        different = _config_differences(config, manifest["config"])
        if different:
            raise DataError(
                f"the prepared data in {out_dir} was built for another data config "
                f"(differs in {', '.join(different)}): {PREPARE_HINT}"
            )
    prepared = _prepared_from(out_dir, manifest)
    if verify:
        expected = [(prepared.tokenizer_path, manifest["tokenizer_sha256"])] + [
            (prepared.directory / e[0], e[3]) for s in ("train", "val") for e in prepared.shards[s]
        ]
        for path, sha in expected:
            if file_sha256(path) != sha:
                raise DataError(
                    f"{path} does not match its SHA-256 in the manifest: {PREPARE_HINT}"
                )
    return prepared


def _reusable(out_dir: Path, key: str) -> PreparedData | None:
    try:
        manifest = read_manifest(out_dir)
        return _prepared_from(out_dir, manifest) if manifest["key"] == key else None
    except DataError as exc:
        if (out_dir / MANIFEST).exists():
            log.warning("rebuilding: %s", exc)
        return None


def open_prepared(
    config: DataConfig, out_dir: str | Path, build: bool, progress: bool = True, workers: int = 1
) -> PreparedData:
    """The prepared data a training job uses.

    ``build=False`` (cluster runs): only the manifest is read (:func:`load_prepared`); missing or
    stale data is an error telling to run ``pretrain/prepare.py``. ``build=True`` (small local runs):
    :func:`prepare_data` builds it when missing or stale, judged from file metadata, not content.
    """
    if build:
        return prepare_data(config, out_dir, progress=progress, workers=workers)
    return load_prepared(out_dir, config)
