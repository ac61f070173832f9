"""Byte-level BPE training with the Huginn special tokens in the last 32 ids of the vocabulary."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from recurrent_model.tokenizer import ALL_SPECIAL_TOKENS as ALL_SPECIALS
from recurrent_model.tokenizer import SPECIAL_TOKENS, HuginnTokenizer, special_token_offset

from .config import DataError

MAX_TOKEN_LENGTH = 32


def _filler_token(i: int) -> str:
    """Never-produced BPE vocabulary entries used when a small corpus yields too few merges."""
    return f"<|unused_bpe_{i}|>"


def new_bpe_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE whose pre-tokenizer splits every digit on its own."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _pad_vocab(tokenizer: Tokenizer, size: int) -> Tokenizer:
    """Fill the BPE vocabulary up to ``size`` entries with unreachable filler tokens."""
    data = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    if len(vocab) > size:
        raise DataError(f"BPE trainer produced {len(vocab)} tokens, more than the {size} asked for")
    for i in range(size - len(vocab)):
        vocab[_filler_token(i)] = len(vocab)
    return Tokenizer.from_str(json.dumps(data))


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, out_path: str | Path, show_progress: bool = False
) -> HuginnTokenizer:
    """Train on ``texts`` and save ``tokenizer.json`` with the specials at ``vocab_size - 32`` …"""
    base_size = special_token_offset(vocab_size)
    if base_size < 256:
        raise DataError(f"vocab_size {vocab_size} leaves fewer than 256 ids for the byte alphabet")
    tokenizer = new_bpe_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=base_size,
        min_frequency=2,
        show_progress=show_progress,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=MAX_TOKEN_LENGTH,
        special_tokens=[],
    )
    tokenizer.train_from_iterator(_non_empty(texts), trainer=trainer)
    tokenizer = _pad_vocab(tokenizer, base_size)
    tokenizer.add_special_tokens(list(ALL_SPECIALS))
    check_special_ids(tokenizer, vocab_size)
    out_path = Path(out_path)
    tokenizer.save(str(out_path))
    return HuginnTokenizer.from_file(out_path)


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    count = 0
    for text in texts:
        if text:
            count += 1
            yield text
    if count == 0:
        raise DataError("no text to train the tokenizer on")


def check_special_ids(tokenizer: Tokenizer, vocab_size: int) -> None:
    """Raise unless the vocabulary has ``vocab_size`` ids and the specials sit at V - 32 …"""
    if tokenizer.get_vocab_size() != vocab_size:
        raise DataError(
            f"tokenizer has {tokenizer.get_vocab_size()} ids, expected vocab_size {vocab_size}"
        )
    offset = special_token_offset(vocab_size)
    for i, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != offset + i:
            raise DataError(
                f"special token {token} has id {tokenizer.token_to_id(token)}, expected {offset + i}"
            )
