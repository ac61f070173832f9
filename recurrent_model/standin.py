"""A clearly labelled, randomly initialised stand-in for the trained default checkpoint.

Used by the app, the notebooks and the tests while ``checkpoints/default/`` does not exist: the tiny
preset with a byte-level tokenizer built on the fly (256 byte tokens, no merges, the Huginn special
tokens at ids V − 32 …). Its trajectories carry no learned structure.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .checkpoint import resolve_dtype
from .config import preset
from .families import load_model
from .model import RecurrentLM
from .tokenizer import ALL_SPECIAL_TOKENS, HuginnTokenizer, special_token_offset

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout (editable install)
DEFAULT_CHECKPOINT = REPO_ROOT / "checkpoints" / "default"
FALLBACK_NAME = "random-init-tiny (UNTRAINED)"
FALLBACK_VOCAB = 512
FALLBACK_CONTEXT = 512


def byte_level_tokenizer(vocab_size: int = FALLBACK_VOCAB) -> HuginnTokenizer:
    """Byte-level BPE with no merges: one token per byte, fillers, then the specials at V − 32."""
    offset = special_token_offset(vocab_size)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if offset < len(alphabet):
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256 byte tokens")
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab |= {f"<|unused_{i}|>": i for i in range(len(vocab), offset)}
    specials = list(ALL_SPECIAL_TOKENS)
    vocab |= {tok: offset + i for i, tok in enumerate(specials)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return HuginnTokenizer(backend)


def fallback_model(seed: int = 0) -> RecurrentLM:
    """The tiny preset (context 512) with seeded random weights and the byte-level tokenizer."""
    config = preset("tiny", vocab_size=FALLBACK_VOCAB, block_size=FALLBACK_CONTEXT)
    config.name = FALLBACK_NAME
    model = RecurrentLM(config, init_weights=False)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    model.tokenizer = byte_level_tokenizer(config.vocab_size)
    return model.eval()


def is_fallback(model: RecurrentLM) -> bool:
    """True for the randomly initialised stand-in built by ``fallback_model``."""
    return model.name == FALLBACK_NAME


def default_model(
    path: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> RecurrentLM:
    """The checkpoint at ``path``; with None, ``checkpoints/default`` when it holds a checkpoint,
    else the labelled random stand-in."""
    if path is not None:
        return load_model(path, device=device, dtype=dtype)
    if (DEFAULT_CHECKPOINT / "config.json").is_file():
        return load_model(DEFAULT_CHECKPOINT, device=device, dtype=dtype)
    model = fallback_model()
    return model.to(device=device or "cpu", dtype=resolve_dtype(dtype))
