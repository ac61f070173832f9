"""Data-pipeline performance: prepare_data stages on the starter corpus and PackedLoader throughput.

1. Build: corpus generation + hashing, tokenizer training, tokenize + pack (tokens/s), then a second
   prepare_data call that reuses the build.
2. Encoding side by side on the same documents: ``encode_batch`` vs ``encode_batch_fast``.
3. PackedLoader: train batches/s and tokens/s from the memory-mapped shards.

Usage: python bench/bench_data.py [--size tiny|small] [--vocab 4096] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import pretrain.data.prepare as prep
from pretrain.data import DataConfig, PackedLoader, prepare_data
from pretrain.data.config import STARTER_SIZES
from pretrain.data.readers import ReadStats
from pretrain.data.tokenizer_training import train_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=STARTER_SIZES)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = DataConfig(starter_size=args.size, vocab_size=args.vocab)
    results: dict = {"size": args.size, "vocab_size": args.vocab}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = prep.Corpus(config)
        t0 = time.perf_counter()
        prep.corpus_hash(corpus, ReadStats(), progress=False)
        results["generate_and_hash_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tok = train_tokenizer(
            (d.text for d in corpus.documents()), args.vocab, Path(tmp) / "t.json"
        )
        results["tokenizer_train_s"] = time.perf_counter() - t0
        texts = [d.text for d in corpus.documents()]
        for name in ("encode_batch", "encode_batch_fast"):
            t0 = time.perf_counter()
            encodings = getattr(tok.backend, name)(texts, add_special_tokens=False)
            results[f"{name}_s"] = time.perf_counter() - t0
        results["corpus_tokens"] = sum(len(e.ids) for e in encodings)
        t0 = time.perf_counter()
        prepared = prepare_data(config, Path(tmp) / "out", progress=False)
        results["prepare_data_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepare_data(config, Path(tmp) / "out", progress=False)
        results["prepare_data_reuse_s"] = time.perf_counter() - t0
        results["train_rows"], results["val_rows"] = prepared.train_rows, prepared.val_rows
        results["tokens_in_rows"] = prepared.stats["tokens"]["train"]["tokens_in_rows"]
        loader = PackedLoader(prepared, "train", batch_size=8)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            next(loader)
        elapsed = time.perf_counter() - t0
        results["loader_batches_per_s"] = n / elapsed
        results["loader_tokens_per_s"] = n * 8 * prepared.block_size / elapsed
    print(
        json.dumps(
            {k: round(v, 3) if isinstance(v, float) else v for k, v in results.items()}, indent=1
        )
    )


if __name__ == "__main__":
    main()
