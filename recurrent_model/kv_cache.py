"""A preallocated key/value cache indexed per layer call, for batched autoregressive decoding.

Layer-call indices follow the reference implementation (:func:`stack.core_call_index`): prelude layer
i -> i, core layer j at iteration ``step`` -> l_P + l_R·(step − 1) + j, coda layer k -> k − l_C
(negative). With a ``budget`` of N core
slots per token, core index c is stored in slot (c − l_P) mod N + l_P, so later iterations overwrite
older ones; a budget ≥ l_R·max_steps is the full cache.

Keys and values live in one tensor of shape (slots, B, 2·heads, max_length, head_dim) allocated once
(keys in the first ``heads`` rows, values in the rest; heads before positions, so each head's keys are
one contiguous block); each forward chunk writes its positions in place and attends over the filled
prefix through (B, heads, T, head_dim) views.
"""

from __future__ import annotations

import os

import torch

from .config import RecurrentConfig
from .stack import core_call_index


class KVCacheTooLarge(MemoryError):
    """A KV cache that cannot fit in the memory available on its device."""


def available_memory(device: torch.device | str | None) -> int:
    """Bytes free for a new allocation on ``device``: CUDA/ROCm free memory, else MemAvailable."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def attention_mask(
    positions: torch.Tensor, n_keys: int, key_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Boolean mask (True = attend) of queries at ``positions`` (T,) over keys 0 … n_keys − 1.

    Causal by position, (T, n_keys). With ``key_valid`` (B, ≥ n_keys) pad keys are masked too, giving
    (B, 1, T, n_keys), and a pad query attends to itself only, so that no row of the softmax is empty.
    Plain tensor ops: the compiled decode builds the same mask inside its graph.
    """
    key_pos = torch.arange(n_keys, device=positions.device)
    mask = key_pos <= positions[:, None]
    if key_valid is None:
        return mask
    return (mask & key_valid[:, None, None, :n_keys]) | (key_pos == positions[:, None])


def check_fits(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str | None, n_core: int
) -> None:
    """Raise :class:`KVCacheTooLarge` naming the bytes when a cache of ``shape`` cannot be allocated."""
    needed = _numel(shape) * torch.empty((), dtype=dtype).element_size()
    free = available_memory(device)
    if needed > free:
        slots, batch, length = shape[0], shape[1], shape[3]
        raise KVCacheTooLarge(
            f"the KV cache needs {needed:,} bytes ({_gib(needed)}: {slots:,} layer slots x "
            f"{batch} rows x {length} positions) but only {free:,} bytes ({_gib(free)}) are "
            "available; lower num_steps / max_steps, or share core-layer slots between iterations "
            f"with cache_budget (e.g. cache_budget={4 * n_core} keeps {4 * n_core} core slots per "
            "token whatever the depth)"
        )


class KVCache:
    """Keys and values of every layer call for ``batch_size`` rows and up to ``max_length`` positions.

    ``max_steps`` is the deepest recurrence any token will run; ``budget`` (core slots per token,
    None = full) enables cache sharing. ``key_valid`` (B, max_length) marks real (non-pad) positions.
    Call :meth:`begin` before each forward chunk to set the positions being written.
    """

    def __init__(
        self,
        config: RecurrentConfig,
        batch_size: int,
        max_length: int,
        max_steps: int,
        budget: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        storage: torch.Tensor | None = None,
    ) -> None:
        shape = self.shape_for(config, batch_size, max_length, max_steps, budget)
        self.n_prelude = config.n_layers_in_prelude
        self.n_core = config.n_layers_in_recurrent_block
        self.n_coda = config.n_layers_in_coda
        self.max_steps = max_steps
        self.max_length = max_length
        self.core_slots = shape[0] - self.n_prelude - self.n_coda
        H = config.n_heads
        if storage is not None:
            if tuple(storage.shape) != shape or storage.dtype != dtype:
                raise ValueError(
                    f"storage of shape {tuple(storage.shape)} and {storage.dtype} does not hold a "
                    f"cache of shape {shape} and {dtype}"
                )
            self.kv = storage
        else:
            check_fits(shape, dtype, device, config.n_layers_in_recurrent_block)
            self.kv = torch.zeros(shape, device=device, dtype=dtype)
        self.kv_slots = list(self.kv.unbind(0))  # (B, 2H, L, D) per slot, written in place
        self.k_slots = [kv[:, :H] for kv in self.kv_slots]  # (B, H, L, D)
        self.v_slots = [kv[:, H:] for kv in self.kv_slots]
        self.key_valid: torch.Tensor | None = None
        self.start = 0
        self.end = 0
        self.mask: torch.Tensor | None = None
        self.is_causal = False

    @staticmethod
    def shape_for(
        config: RecurrentConfig,
        batch_size: int,
        max_length: int,
        max_steps: int,
        budget: int | None = None,
    ) -> tuple[int, int, int, int, int]:
        """The storage shape (slots, B, 2·heads, max_length, head_dim); checks the arguments.

        Heads before positions: each head's keys are one contiguous (max_length, head_dim) block, so
        attention reads along positions row by row (one fused softmax per head in compiled decoding).
        """
        if batch_size < 1 or max_length < 1 or max_steps < 1:
            raise ValueError(
                f"batch_size, max_length and max_steps must be >= 1, got "
                f"{batch_size}, {max_length}, {max_steps}"
            )
        if budget is not None and budget < 1:
            raise ValueError(f"cache_budget must be >= 1 core-layer slot per token, got {budget}")
        full = config.n_layers_in_recurrent_block * max_steps
        core = full if budget is None else min(int(budget), full)
        n_slots = config.n_layers_in_prelude + core + config.n_layers_in_coda
        return (n_slots, batch_size, 2 * config.n_heads, max_length, config.head_dim)

    @property
    def shared(self) -> bool:
        """True when core slots are shared between iterations (budget below the full cache)."""
        return self.core_slots < self.n_core * self.max_steps

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the key and value tensors."""
        return self.kv.numel() * self.kv.element_size()

    def physical(self, index: int) -> int:
        """The storage slot of layer call ``index`` (prelude i, core l_P + …, coda negative)."""
        if index < 0:
            if index < -self.n_coda:
                raise IndexError(f"coda layer-call index {index} below -{self.n_coda}")
            return self.n_prelude + self.core_slots + self.n_coda + index
        if index < self.n_prelude:
            return index
        c = index - self.n_prelude
        if c >= self.n_core * self.max_steps:
            raise IndexError(
                f"core layer-call index {index} is beyond the {self.max_steps} iterations this "
                "cache was allocated for"
            )
        return self.n_prelude + c % self.core_slots

    def core_slot(self, step: int, layer: int) -> int:
        """The storage slot of core layer ``layer`` at 1-based iteration ``step``."""
        return self.physical(core_call_index(self.n_prelude, self.n_core, step, layer))

    def set_padding(self, attention_mask: torch.Tensor) -> None:
        """Mark pad positions of the prompt (attention_mask (B, T), 0 = pad); later ones are real."""
        B, T = attention_mask.shape
        if B != self.kv.shape[1] or T > self.max_length:
            raise ValueError(
                f"attention_mask of shape {tuple(attention_mask.shape)} does not fit a cache for "
                f"{self.kv.shape[1]} rows and {self.max_length} positions"
            )
        valid = torch.ones(B, self.max_length, dtype=torch.bool, device=self.kv.device)
        valid[:, :T] = attention_mask.to(device=self.kv.device).bool()
        self.key_valid = None if bool(valid.all()) else valid

    def begin(self, start: int, length: int) -> None:
        """Set the positions start … start + length − 1 that the next forward chunk writes.

        Computes the attention mask once for every layer call of the chunk: None for a plain causal
        chunk from position 0 or a single unpadded token, else a boolean (B | 1, 1, T, end) mask.
        """
        end = start + length
        if start < 0 or length < 1 or end > self.max_length:
            raise ValueError(
                f"positions {start}..{end - 1} do not fit a cache of {self.max_length} positions"
            )
        self.start, self.end = start, end
        self.is_causal = False
        self.mask = None
        valid = self.key_valid
        if valid is None:
            if length == 1:
                return
            if start == 0:
                self.is_causal = True
                return
        if valid is not None and length == 1:
            self.mask = valid[:, None, None, :end]
            return
        self.mask = attention_mask(torch.arange(start, end, device=self.kv.device), end, valid)

    def freeze_exits(self, position: int, steps: torch.Tensor) -> None:
        """Fill the core entries of token ``position`` above each row's exit iteration.

        Row b exited after ``steps[b]`` iterations; every later iteration's entry for core layer j becomes
        a copy of its entry at iteration steps[b] (the "latest entry for the same core layer" rule), so
        deeper tokens later read it there.
        """
        exits = [int(s) for s in steps.tolist()]
        S, l_R, P = self.max_steps, self.n_core, self.n_prelude
        for b, r in enumerate(exits):
            if r >= S:
                continue
            if r < 1:
                raise ValueError(f"row {b} exited after {r} iterations; at least 1 is required")
            if not self.shared:
                core = self.kv[P : P + l_R * S].unflatten(0, (S, l_R))
                core[r:, :, b, :, position] = core[r - 1, :, b, :, position]
                continue
            saved = [self.kv[self.core_slot(r, j), b, :, position].clone() for j in range(l_R)]
            for step in range(r + 1, S + 1):
                for j, entry in enumerate(saved):
                    self.kv[self.core_slot(step, j), b, :, position] = entry

    def slot(self, index: int) -> CacheSlot:
        """A :class:`~recurrent_model.functional.KVCacheSlot` for one layer call's keys and values."""
        return CacheSlot(self, self.physical(index))


class CacheSlot:
    """One layer call's view of a :class:`KVCache`: writes this chunk's keys/values, returns the prefix."""

    __slots__ = ("cache", "index")

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache = cache
        self.index = index

    def update(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        c = self.cache
        kbuf, vbuf = c.k_slots[self.index], c.v_slots[self.index]
        kbuf[:, :, c.start : c.end] = k
        vbuf[:, :, c.start : c.end] = v
        return kbuf[:, :, : c.end], vbuf[:, :, : c.end], c.mask


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
