"""``prepare_data``: corpus → tokenizer → packed train/val shards, built atomically and reused.

Layout of ``out_dir``: ``manifest.json`` (written last, by an atomic rename) names the build directory
``build-<key>/`` holding ``tokenizer.json`` and ``train-00000.npy``, ``val-00000.npy``, … (uint16 rows
of ``block_size + 1`` ids, uint32 above 65,536 ids). The key hashes the config and the corpus content,
so a second call with the same config and corpus returns the existing build without rebuilding.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from tqdm.auto import tqdm

from recurrent_model.atomic_io import atomic_write_text, replace_durably
from recurrent_model.tokenizer import HuginnTokenizer, TokenizerError

from .config import STARTER, DataConfig, DataError, PreparedData
from .packing import Packer, ShardWriter, row_dtype
from .readers import Document, ReadStats, read_source
from .starter_corpus import starter_documents
from .tokenizer_training import check_special_ids, train_tokenizer

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_TRAIN_BYTES = 256 * 2**20
ENCODE_BATCH = 4096
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

    def documents(self, stats: ReadStats | None = None) -> Iterator[Document]:
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
                yield doc
            if stats.docs_per_source[source] == before:
                raise DataError(f"corpus source {source!r} has no documents: the corpus is empty")

    def is_keep_all(self, doc: Document) -> bool:
        keep = self.config.keep_all_sources
        return doc.source in keep or f"{doc.source}:{doc.kind}" in keep


def corpus_hash(corpus: Corpus, stats: ReadStats, progress: bool) -> str:
    """SHA-256 over every document's source, kind and text, in corpus order."""
    digest = hashlib.sha256()
    for doc in tqdm(
        corpus.documents(stats), desc="reading corpus", unit="doc", disable=not progress
    ):
        for part in (doc.source, doc.kind, doc.text):
            data = part.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_key(config: DataConfig, corpus_digest: str) -> str:
    tokenizer = None
    if config.tokenizer_path is not None:
        path = Path(config.tokenizer_path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise DataError(f"tokenizer_path {config.tokenizer_path} has no tokenizer.json")
        tokenizer = _file_hash(path)
    payload = {
        "format": FORMAT_VERSION,
        "config": asdict(config),
        "corpus": corpus_digest,
        "tokenizer": tokenizer,
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
        tqdm.write(f"training a {config.vocab_size}-token byte-level BPE tokenizer")
    return train_tokenizer(texts(), config.vocab_size, out_path, show_progress=progress)


def _encoded(
    corpus: Corpus, tokenizer: HuginnTokenizer, progress: bool
) -> Iterator[tuple[Document, list[int]]]:
    batch: list[Document] = []
    docs = tqdm(corpus.documents(), desc="tokenizing and packing", unit="doc", disable=not progress)
    for doc in docs:
        batch.append(doc)
        if len(batch) == ENCODE_BATCH:
            yield from _encode_batch(tokenizer, batch)
            batch = []
    yield from _encode_batch(tokenizer, batch)


def _encode_batch(tokenizer: HuginnTokenizer, batch: list[Document]):
    if not batch:
        return
    backend = tokenizer.backend
    # encode_batch_fast (tokenizers >= 0.20) skips character offsets, which packing does not need.
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    encodings = encode([d.text for d in batch], add_special_tokens=False)
    yield from zip(batch, (e.ids for e in encodings))


def _pack_splits(
    config: DataConfig, corpus: Corpus, tokenizer: HuginnTokenizer, build: Path, progress: bool
) -> tuple[dict[str, list[list]], dict]:
    """Assign each document to train or val (seeded), pack and write both splits."""
    row_length = config.block_size + 1
    dtype = row_dtype(config.vocab_size)
    packers = {s: Packer(row_length, tokenizer.bos_id, tokenizer.eos_id) for s in ("train", "val")}
    writers = {s: ShardWriter(build, s, row_length, dtype) for s in ("train", "val")}
    split_rng = random.Random(f"split:{config.seed}")
    tokens = {"train": 0, "val": 0}
    for doc, ids in _encoded(corpus, tokenizer, progress):
        split = "val" if split_rng.random() < config.val_fraction else "train"
        tokens[split] += len(ids) + 2
        for row in packers[split].add(ids, corpus.is_keep_all(doc)):
            writers[split].write(row)
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
    return shards, token_stats


def prepare_data(config: DataConfig, out_dir: str | Path, progress: bool = True) -> PreparedData:
    """Build (or reuse) the tokenizer and packed shards for ``config`` under ``out_dir``.

    Call it on rank 0 only; other ranks wait on a barrier and call :func:`load_prepared`.
    """
    config.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = Corpus(config)
    stats = ReadStats()
    digest = corpus_hash(corpus, stats, progress)
    key = build_key(config, digest)
    existing = _reusable(out_dir, key)
    if existing is not None:
        if progress:
            tqdm.write(f"reusing prepared data in {out_dir} ({existing.summary()})")
        return existing
    _warn_invalid_utf8(stats)

    build_name = f"build-{key[:16]}"
    tmp = out_dir / f".tmp-{build_name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tokenizer = _load_tokenizer(config, corpus, tmp / "tokenizer.json", progress)
        shards, token_stats = _pack_splits(config, corpus, tokenizer, tmp, progress)
        shards = {s: [[f"{build_name}/{n}", r] for n, r in v] for s, v in shards.items()}
        prepared = PreparedData(
            directory=out_dir,
            tokenizer_path=out_dir / build_name / "tokenizer.json",
            corpus_hash=digest,
            train_rows=sum(r for _, r in shards["train"]),
            val_rows=sum(r for _, r in shards["val"]),
            block_size=config.block_size,
            vocab_size=config.vocab_size,
            stats={**stats.as_dict(), "tokens": token_stats},
            shards=shards,
        )
        _check_rows(prepared, config)
        final = out_dir / build_name
        shutil.rmtree(final, ignore_errors=True)
        replace_durably(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_manifest(out_dir, key, config, prepared)
    _prune(out_dir, keep=build_name)
    if progress:
        tqdm.write(f"prepared data in {out_dir}: {prepared.summary()}")
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


def _write_manifest(out_dir: Path, key: str, config: DataConfig, prepared: PreparedData) -> None:
    manifest = {
        "format": FORMAT_VERSION,
        "key": key,
        "config": asdict(config),
        "prepared": prepared.to_json(),
    }
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1))


def _prune(out_dir: Path, keep: str) -> None:
    for path in out_dir.glob("build-*"):
        if path.name != keep and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _read_manifest(out_dir: Path) -> dict | None:
    path = out_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc


def _reusable(out_dir: Path, key: str) -> PreparedData | None:
    manifest = _read_manifest(out_dir)
    if manifest is None or manifest.get("key") != key:
        return None
    prepared = PreparedData.from_json(out_dir, manifest["prepared"])
    files = [prepared.tokenizer_path] + [
        p for s in prepared.shards for p, _ in prepared.shard_paths(s)
    ]
    return prepared if all(p.is_file() for p in files) else None


def load_prepared(out_dir: str | Path) -> PreparedData:
    """The data that :func:`prepare_data` built under ``out_dir``."""
    out_dir = Path(out_dir)
    manifest = _read_manifest(out_dir)
    if manifest is None:
        raise DataError(f"no prepared data in {out_dir} ({MANIFEST} missing): run prepare_data")
    if manifest.get("format") != FORMAT_VERSION:
        raise DataError(
            f"{out_dir / MANIFEST} has format {manifest.get('format')}, "
            f"expected {FORMAT_VERSION}: prepare the data again"
        )
    return PreparedData.from_json(out_dir, manifest["prepared"])
