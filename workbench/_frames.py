"""Shared helpers: checking state arrays and building (position, step) long-format frames."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd


def as_states(states: np.ndarray, ndim: int = 3, what: str = "states") -> np.ndarray:
    """``states`` as float32 (float64 kept), with the expected number of axes or a clear error."""
    arr = np.asarray(states)
    if arr.ndim != ndim:
        shape = "(steps + 1, T, h)" if ndim == 3 else "(n_seeds, steps + 1, T, h)"
        raise ValueError(f"{what} must be {shape}, got shape {arr.shape}")
    if arr.dtype != np.float64:
        arr = arr.astype(np.float32, copy=False)
    return arr


def token_labels(tokens: Sequence[str] | None, n: int) -> np.ndarray:
    """Token strings for n positions (the position number when none are given)."""
    if tokens is None:
        return np.asarray([str(i) for i in range(n)], dtype=object)
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} token strings for {n} positions")
    return np.asarray(list(tokens), dtype=object)


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\ufffd": "\\ufffd"}


def printable(text: str) -> str:
    """``text`` with every character a reader cannot see written as an escape: ``\\n``, ``\\t``,
    ``\\x0c``, ``\\u200b``, and the replacement character of a lossy decode as ``\\ufffd``."""
    out = []
    for ch in str(text):
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ch == " " or ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
    return "".join(out)


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet, character -> byte: the printable Latin-1 bytes stand for
    themselves and the other bytes, in order, for the characters from U+0100 on."""
    visible = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet, hidden = {}, 0
    for byte in range(256):
        if byte in visible:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(0x100 + hidden)] = byte
            hidden += 1
    return alphabet


_BYTE_LEVEL = _byte_level_alphabet()


def _utf8_with_byte_escapes(raw: bytes) -> str:
    """``raw`` decoded as UTF-8, each byte that is not part of a whole character shown as <0xE4>."""
    out, start = [], 0
    while start < len(raw):
        try:
            out.append(raw[start:].decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            out.append(raw[start : start + err.start].decode("utf-8"))
            out.extend(f"<0x{b:02X}>" for b in raw[start + err.start : start + err.end])
            start += err.end
    return "".join(out)


def byte_level_text(piece: str) -> str:
    """The display text of one byte-level BPE vocabulary entry (``Tokenizer.id_to_token``): its
    bytes as UTF-8 with partial characters as ``<0xE4>``, then `printable`. An entry outside the
    byte alphabet (an added special token) is shown as it is."""
    if not all(ch in _BYTE_LEVEL for ch in piece):
        return printable(piece)
    return printable(_utf8_with_byte_escapes(bytes(_BYTE_LEVEL[ch] for ch in piece)))


def token_display_strings(tokenizer: object, ids: Sequence[int]) -> list[str]:
    """Printable text of each token id, byte tokens as ``<0xE4>`` and newlines as ``\\n``, from a
    `HuginnTokenizer` (or a ``tokenizers.Tokenizer``) with a byte-level vocabulary."""
    backend = getattr(tokenizer, "backend", tokenizer)
    if not hasattr(backend, "id_to_token"):
        raise TypeError(f"{type(tokenizer).__name__} has no id_to_token vocabulary lookup")
    texts = []
    for i in ids:
        piece = backend.id_to_token(int(i))
        if piece is None:
            raise ValueError(f"token id {int(i)} is outside the tokenizer's vocabulary")
        texts.append(byte_level_text(piece))
    return texts


def shown_token(text: str) -> str:
    """One token as every table, label and hover text shows it: in quotes, so a space or an empty
    token is visible, with `printable` escapes (``' m'``, ``'\\n'``, ``'<0xE4>'``)."""
    return f"'{printable(text)}'"


def position_labels(tokens: Sequence[str] | None, n: int, width: int = 40) -> list[str]:
    """Unique display labels "i: 'token'" for n positions, the token as `shown_token` and cut to
    ``width`` characters (the position alone when no tokens are given): the one label format of
    figures and the app."""
    if tokens is None:
        return [str(i) for i in range(n)]
    return [f"{i}: {shown_token(t)}"[:width] for i, t in enumerate(token_labels(tokens, n))]


def position_step_frame(
    columns: dict[str, np.ndarray], tokens: Sequence[str] | None
) -> pd.DataFrame:
    """Long frame from (steps, T) arrays: one row per (position, step), by position."""
    first = next(iter(columns.values()))
    n_steps, T = first.shape
    pos, step = np.meshgrid(np.arange(T), np.arange(n_steps), indexing="ij")
    data: dict[str, np.ndarray] = {
        "position": pos.ravel(),
        "token": token_labels(tokens, T)[pos.ravel()],
        "step": step.ravel(),
    }
    for name, values in columns.items():
        data[name] = np.asarray(values).T.ravel()
    return pd.DataFrame(data)
