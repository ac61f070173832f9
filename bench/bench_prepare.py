"""Data preparation before the job: build throughput by number of tokenizer processes, and what a
training job's start costs (manifest only) against re-reading and hashing the corpus.

Side by side in one run, on the starter corpus written out as a JSONL file (read like a user corpus):
1. raw ``encode_batch_fast`` over all texts held in memory (the tokenizer alone, its own threads);
2. ``prepare_data`` (read, split, tokenize, pack, write shards + hashes) with 1, 2, … worker processes,
   as tokens/s and as a ratio to (1);
3. opening prepared data: ``load_prepared`` (the training job), the metadata reuse check of
   ``prepare_data``, and, for comparison, a full read-and-hash pass over the corpus.

Usage: python bench/bench_prepare.py [--size tiny|small|medium|full] [--vocab 4096] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pretrain.data.prepare as prep
from pretrain.data import DataConfig, load_prepared, prepare_data
from pretrain.data.config import STARTER_SIZES
from pretrain.data.readers import ReadStats
from pretrain.data.starter_corpus import starter_documents
from pretrain.data.tokenizer_training import train_tokenizer


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=STARTER_SIZES)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        texts = [d.text for d in starter_documents(args.size, 0)]
        with open(corpus, "w") as f:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
        tokenizer = train_tokenizer(iter(texts), args.vocab, root / "tokenizer.json")
        encodings, raw_s = _timed(
            lambda: tokenizer.backend.encode_batch_fast(texts, add_special_tokens=False)
        )
        tokens = sum(len(e.ids) for e in encodings)
        results = {
            "documents": len(texts),
            "corpus_mb": round(corpus.stat().st_size / 2**20, 2),
            "tokens": tokens,
            "raw_encode_tokens_per_s": round(tokens / raw_s),
        }
        config = DataConfig(
            sources=[str(corpus)],
            vocab_size=args.vocab,
            tokenizer_path=str(root / "tokenizer.json"),
        )
        for workers in args.workers:
            out = root / f"out-{workers}"
            _, build_s = _timed(lambda: prepare_data(config, out, False, workers))  # noqa: B023
            results[f"prepare_workers_{workers}_tokens_per_s"] = round(tokens / build_s)
            results[f"prepare_workers_{workers}_vs_raw_encode"] = round(raw_s / build_s, 3)
        out = root / f"out-{args.workers[0]}"
        _, load_s = _timed(lambda: load_prepared(out, config))
        _, reuse_s = _timed(lambda: prepare_data(config, out, False))
        _, hash_s = _timed(lambda: prep.corpus_hash(prep.Corpus(config), ReadStats()))
        results["job_start_load_prepared_s"] = round(load_s, 4)
        results["prepare_reuse_check_s"] = round(reuse_s, 4)
        results["old_job_start_read_and_hash_s"] = round(hash_s, 4)
        results["read_and_hash_vs_load_prepared"] = round(hash_s / load_s, 1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
