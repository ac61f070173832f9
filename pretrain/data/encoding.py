"""Tokenize batches of texts in worker processes, results in submission order.

``encode_batches(tokenizer_path, batches, workers)`` takes ``(payload, texts)`` pairs and yields
``(payload, token-id lists)`` in input order, whatever the number of workers: the output (and so every shard built from it)
is byte-for-byte the same for 1 and N workers. At most ``2 * workers`` batches are in flight, so a
corpus larger than memory streams through. Workers are spawned (not forked: the parent may hold
tokenizer threads) and each loads the tokenizer once.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

import numpy as np

T = TypeVar("T")
_worker_tokenizer = None


def _load(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def _ids(tokenizer, texts: list[str]) -> list[list[int]]:
    # encode_batch_fast (tokenizers >= 0.20) skips character offsets, which packing does not need.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=False)]


def _encode(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Flat uint32 ids and lengths: one compact buffer to send back from a worker."""
    encodings = _ids(tokenizer, texts)
    lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
    ids = np.fromiter(
        itertools.chain.from_iterable(encodings), dtype=np.uint32, count=int(lengths.sum())
    )
    return ids, lengths


def _init_worker(path: str) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker process
    _worker_tokenizer = _load(path)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return _encode(_worker_tokenizer, texts)


def _split(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    flat = ids.tolist()
    out, start = [], 0
    for n in lengths.tolist():
        out.append(flat[start : start + n])
        start += n
    return out


def encode_batches(
    tokenizer_path: str, batches: Iterable[tuple[T, list[str]]], workers: int = 1
) -> Iterator[tuple[T, list[list[int]]]]:
    """Token ids of every text, batch by batch in input order; ``workers > 1`` uses processes."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1:
        tokenizer = _load(tokenizer_path)
        for payload, texts in batches:
            yield payload, _ids(tokenizer, texts)
        return
    context = multiprocessing.get_context("spawn")
    # A pool whose workers cannot start raises BrokenProcessPool instead of waiting forever.
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(tokenizer_path,)
    ) as pool:
        in_flight: deque = deque()
        try:
            for payload, texts in batches:
                in_flight.append((payload, pool.submit(_encode_in_worker, texts)))
                if len(in_flight) >= 2 * workers:
                    payload, result = in_flight.popleft()
                    yield payload, _split(*result.result())
            while in_flight:
                payload, result = in_flight.popleft()
                yield payload, _split(*result.result())
        except BrokenProcessPool as exc:
            raise RuntimeError(
                f"a tokenizer worker process died ({exc}); try --workers 1 to see the error"
            ) from exc
