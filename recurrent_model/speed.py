"""How fast this machine runs the model's matmuls: one probe, timed the way the model runs them.

``linear_speed(model, rows)`` times ``F.linear`` with the model's own core-block weights (no copy),
in its dtype and on its device, on ``rows`` token states, within a fraction of a second. Each
result records when it was measured and the load average then; a later call measures again when
the result is older than ``MAX_AGE_S`` or the load has moved by ``LOAD_CHANGE`` since, so a timing
taken on a busy machine is not kept for the life of the process.

``F.linear`` and not ``a @ b``: in bfloat16 on a CPU the two can differ by more than 10×, and the
model multiplies through ``F.linear``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import RecurrentConfig

BUDGET_S = 0.25  # one measurement's wall time, about
MAX_AGE_S = 300.0  # a measurement older than this is taken again
LOAD_CHANGE = 1.0  # ... and one whose 1-minute load average has moved this much, after MIN_AGE_S
MIN_AGE_S = 15.0
RANDOM_WEIGHT_BYTES = 64 * 2**20  # a config-only probe allocates at most this much weight
FLOOR_FLOPS = 1e6  # a result is never below this (a timer glitch must not give 0 or infinity)


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


@dataclass(frozen=True)
class Speed:
    """One timing of ``F.linear``: FLOP/s and the circumstances it was measured in."""

    flops_per_second: float
    device: str
    dtype: str
    rows: int  # token states per product
    threads: int  # torch's intra-op threads when measured
    shapes: tuple[tuple[int, int], ...]  # (out, in) of the weights timed
    measured_at: float  # time.time()
    load: float  # 1-minute load average when measured
    seconds: float  # what the measurement took

    @classmethod
    def assumed(cls, flops_per_second: float, device: str = "cpu", dtype: str = "float32") -> Speed:
        """A speed taken as given, not measured (a stand-in device in tests and what-ifs)."""
        return cls(flops_per_second, device, dtype, 1, torch.get_num_threads(), (), time.time(),
                   load_average(), 0.0)  # fmt: skip

    @property
    def gflops(self) -> float:
        return self.flops_per_second / 1e9

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.measured_at

    def stale(self, now: float | None = None, load: float | None = None) -> bool:
        """Too old, or measured under a load that has changed since."""
        age = self.age(now)
        load = load_average() if load is None else load
        return age > MAX_AGE_S or (age > MIN_AGE_S and abs(load - self.load) >= LOAD_CHANGE)

    def describe(self) -> str:
        """E.g. "9.8 GFLOP/s (F.linear, bfloat16, cpu, 46 rows, 2 threads; measured 14:10:05 at
        load 1.3)"."""
        when = time.strftime("%H:%M:%S", time.localtime(self.measured_at))
        return (
            f"{format_gflops(self.flops_per_second)} (F.linear, {self.dtype}, {self.device}, "
            f"{self.rows} rows, {self.threads} thread{'s' if self.threads != 1 else ''}; "
            f"measured {when} at load {self.load:.1f})"
        )


def format_gflops(flops_per_second: float) -> str:
    """FLOP/s as GFLOP/s with two significant digits at least (never "0")."""
    g = flops_per_second / 1e9
    return f"{g:.0f} GFLOP/s" if g >= 10 else f"{g:.2g} GFLOP/s"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA and ROCm), so a wall-clock timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """One weight of each projection shape of a block (the family's cost layout), in the model's
    order: the products that dominate a forward."""
    wanted = set(model.config.cost.block_shapes().values())
    found: dict[tuple[int, int], torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and tuple(module.weight.shape) in wanted:
            found.setdefault(tuple(module.weight.shape), module.weight)
    return list(found.values())


def random_weights(config: RecurrentConfig, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    """Random weights of the block's shapes, smallest first, within RANDOM_WEIGHT_BYTES (at least
    the smallest): for a probe without a model."""
    shapes = sorted(config.cost.block_shapes().values(), key=lambda s: s[0] * s[1])
    size, chosen = torch.empty((), dtype=dtype).element_size(), []
    for shape in shapes:
        if (
            chosen
            and (sum(o * i for o, i in chosen) + shape[0] * shape[1]) * size > RANDOM_WEIGHT_BYTES
        ):
            break
        chosen.append(shape)
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen).to(device, dtype) for s in chosen]


def _timed(x: torch.Tensor, weights: Sequence[torch.Tensor], rounds: int) -> float:
    """Seconds of ``rounds`` rounds of F.linear(x[..., :in], w) over the weights."""
    inputs = [x[:, : w.shape[1]] for w in weights]
    synchronize(x.device)
    start = time.perf_counter()
    for _ in range(rounds):
        for xi, w in zip(inputs, weights):
            F.linear(xi, w)
    synchronize(x.device)
    return time.perf_counter() - start


MAX_ROWS = 512  # more token states than this are timed at this many (the speed has levelled)
MIN_OUT = 1024  # a weight cut to fit the budget keeps this many output rows (a GEMM that small
# no longer runs at the full product's speed)


def _guess(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> float:
    """A first FLOP/s: one round over every weight at one row (which also reads each weight in,
    a memory-mapped checkpoint's pages included), then the best of three products of up to 32
    rows with the smallest weight."""
    _timed(x[:1], weights, 1)
    w0, few = min(weights, key=lambda w: w.numel()), min(len(x), 32)
    first = min(_timed(x[:few], [w0], 1) for _ in range(3))
    return 2.0 * few * w0.numel() / max(first, 1e-9)


def _fit(weights: Sequence[torch.Tensor], rows: int, flops: float) -> list[torch.Tensor]:
    """The weights, each cut to its first output rows (not below MIN_OUT) so that one round on
    ``rows`` token states costs about ``flops``: the in-dimension and the rows stay the model's."""
    full = 2.0 * rows * sum(w.numel() for w in weights)
    if full <= flops:
        return list(weights)
    keep = flops / full
    return [w[: max(min(MIN_OUT, w.shape[0]), int(w.shape[0] * keep))] for w in weights]


def measure(weights: Sequence[torch.Tensor], rows: int, budget_s: float = BUDGET_S) -> Speed:
    """FLOP/s of F.linear on ``rows`` token states (at most MAX_ROWS) with ``weights`` (their
    dtype and device).

    After a warm-up that reads every weight and guesses the speed (``_guess``), each weight is cut
    to its first output rows where needed so that one round over all of them takes about a third
    of ``budget_s``; products then run in turn, smallest weight first, until two thirds have
    passed (at least one product)."""
    t0, dtype = time.perf_counter(), weights[0].dtype
    dev, rows = weights[0].device, min(MAX_ROWS, max(1, int(rows)))
    width = max(w.shape[1] for w in weights)
    with torch.inference_mode():
        x = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)).to(dev, dtype)
        fitted = _fit(weights, rows, budget_s / 3 * _guess(x, weights))
        timed = sorted(fitted, key=torch.numel)
        done, flops, elapsed = 0, 0.0, 0.0
        while done == 0 or (elapsed < 2 * budget_s / 3 and done < 4000):
            w = timed[done % len(timed)]
            elapsed += _timed(x, [w], 1)
            flops += 2.0 * rows * w.numel()
            done += 1
    return Speed(
        max(FLOOR_FLOPS, flops / max(elapsed, 1e-9)), str(dev), str(dtype).removeprefix("torch."),
        rows, torch.get_num_threads(), tuple(tuple(w.shape) for w in fitted), time.time(),
        load_average(), time.perf_counter() - t0,
    )  # fmt: skip


def rows_bucket(rows: int) -> int:
    """The power of two at or above ``rows``: products on similar row counts share a timing."""
    return 1 << max(0, int(rows) - 1).bit_length()


_measured: dict[tuple, Speed] = {}
_lock = threading.Lock()


def linear_speed(
    model: torch.nn.Module | None = None,
    rows: int = 1,
    *,
    config: RecurrentConfig | None = None,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    budget_s: float = BUDGET_S,
) -> Speed:
    """This machine's F.linear speed at the model's shapes, measured again when stale.

    With ``model``: its own weights, dtype and device. Without: random weights of ``config``'s
    block shapes (see random_weights) in ``dtype`` on ``device``."""
    if model is not None:
        config, weights = model.config, None
        dev, dt = str(probe_weights(model)[0].device), probe_weights(model)[0].dtype
    else:
        if config is None:
            raise ValueError("linear_speed needs a model or a config")
        dev, dt = str(torch.device(device)), _dtype(dtype)
    shapes = tuple(config.cost.block_shapes().values())
    key = (dev, str(dt), shapes, rows_bucket(rows), torch.get_num_threads())
    with _lock:
        held = _measured.get(key)
        if held is None or held.stale():
            weights = probe_weights(model) if model is not None else random_weights(config, dt, dev)
            held = _measured[key] = measure(weights, rows, budget_s)
        return held


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    return (
        dtype
        if isinstance(dtype, torch.dtype)
        else getattr(torch, str(dtype).removeprefix("torch."))
    )


def forget() -> None:
    """Drop every held measurement (the next call measures again)."""
    with _lock:
        _measured.clear()
        _overheads.clear()


@dataclass(frozen=True)
class CallOverhead:
    """Seconds one sandwich-block call costs beyond its matmuls (dispatch, norms, RoPE, small
    kernels), from a forward of a tiny random model in the same dtype on the same device."""

    seconds: float
    device: str
    dtype: str
    threads: int
    measured_at: float
    load: float

    def stale(self, now: float | None = None, load: float | None = None) -> bool:
        age = (time.time() if now is None else now) - self.measured_at
        load = load_average() if load is None else load
        return age > MAX_AGE_S or (age > MIN_AGE_S and abs(load - self.load) >= LOAD_CHANGE)


def measure_call_overhead(device: str, dtype: torch.dtype, steps: int = 8) -> CallOverhead:
    """The best of three forwards of the tiny preset (4 tokens, ``steps`` iterations) per layer
    call: its matmuls are a few MFLOP, so the time is what a block call costs regardless of size."""
    from .config import preset
    from .model import RecurrentLM

    torch.manual_seed(0)
    tiny = RecurrentLM(preset("tiny")).eval().to(device, dtype)
    ids = torch.arange(1, 5, device=device)[None]
    best = float("inf")
    with torch.inference_mode():
        tiny(ids, num_steps=steps)  # warm-up
        for _ in range(3):
            synchronize(torch.device(device))
            start = time.perf_counter()
            tiny(ids, num_steps=steps)
            synchronize(torch.device(device))
            best = min(best, time.perf_counter() - start)
    per_call = best / tiny.config.cost.layer_calls(steps)
    name = str(dtype).removeprefix("torch.")
    threads = torch.get_num_threads()
    return CallOverhead(per_call, str(device), name, threads, time.time(), load_average())


_overheads: dict[tuple, CallOverhead] = {}


def call_overhead(device: str, dtype: str | torch.dtype) -> CallOverhead:
    """This machine's cost of one block call in ``dtype`` on ``device``, measured again when
    stale (see CallOverhead)."""
    dt = _dtype(dtype)
    key = (str(torch.device(device)), str(dt), torch.get_num_threads())
    with _lock:
        held = _overheads.get(key)
        if held is None or held.stale():
            held = _overheads[key] = measure_call_overhead(str(torch.device(device)), dt)
        return held
