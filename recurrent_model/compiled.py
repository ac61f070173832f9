"""Fixed-depth decoding through static-shape functions compiled with torch.compile.

Both run the forward recipe of :mod:`recurrent_model.stack` over KV-cache slots of a static shape:
keys and values are written into the whole preallocated slot with ``index_copy_`` at the chunk's
positions and attention reads all ``max_length`` positions under a mask (a prompt chunk from
position 0 attends causally over its own keys instead, so the fused attention skips the blocks above
the diagonal).

- A decode step (one token per row) is one compiled graph: embedding, prelude, ``num_steps`` core
  iterations, coda and head, so a token costs one call instead of ~25 torch calls per layer. A token
  deeper than ``MAX_UNROLLED_STEPS`` runs as a few such graphs (prelude, chunks of iterations, coda).
- A prompt prefill calls one compiled sandwich block per layer call (weights, slot, positions and
  mask are its inputs, so one graph serves every layer and prompt length); at prompt lengths the
  matmuls dominate, and one block compiles far faster than a whole prefill graph.

Inductor fuses the element-wise work (norms, RoPE, SiLU, residual adds, the cache write). On the CPU
a batch-1 decode token becomes a single C++ kernel with a C++ launcher, its intermediates raw
pointers into one memory pool and one barrier per run of serial loops (:func:`cpu_options`), its
projections and attention written as sums (see :func:`functional.linear`), its attention reading
the cache up to the token's position (a length marked dynamic, :func:`_key_ranges`). On a CUDA (or
ROCm) GPU ``mode="reduce-overhead"`` also captures CUDA graphs, for which the cache storage is kept
at one static address per model and shape. The first call for a new shape pays the compile; later calls
with the same shapes, depth and cache budget reuse it, and ``compile_seconds`` reports what a call
paid. On the CPU, a decode piece's later calls skip dynamo altogether (:class:`_DirectGraph`), and
in inference mode torch.compile's Python wrappers around inductor's graph too
(:mod:`.inductor_boxed`), on the torch releases in ``DIRECT_CALL_TORCH``.

What persists between calls lives in the model's :class:`CompileState` (:func:`compile_state`):
the static storage, one compiled function per graph key and the direct-call graphs. The module
itself holds no mutable state.
"""

from __future__ import annotations

import re
import time
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

from . import functional as fn
from . import inductor_pool_pointers, inductor_raw_entry, inductor_serial_chains, stack
from .inductor_boxed import boxed_graph
from .inductor_isa import isa_options
from .inductor_raw_entry import OutputBuffers, RawCall, RawEntry
from .kv_cache import KVCache, attention_mask, check_fits
from .stack import LayerStack
from .torch_release import torch_release

if TYPE_CHECKING:
    from .config import RecurrentConfig
    from .model import RecurrentLM

#: The decode piece's tensor arguments, in order (see _decode_piece), and those of them that change
#: from token to token; every other input of its graph is fixed by the CompiledDecode (weights, RoPE
#: table, cache slot views).
_PIECE_ARGS = ("w", "x", "positions", "rope", "state", "slots", "key_valid", "keys")
_PER_TOKEN_ARGS = ("x", "positions", "state", "key_valid", "keys")
_PER_TOKEN_SOURCE = re.compile(r"L\['(\w+)'\](?:\.size\(\)\[(\d+)\])?")


def per_token_source(source: str) -> tuple[int, int | None] | None:
    """Where a graph input named ``source`` comes from among the per-token arguments: (index in
    _PER_TOKEN_ARGS, None) for the tensor itself, (index, dim) for one of its sizes (a length marked
    dynamic); None for any other source."""
    match = _PER_TOKEN_SOURCE.fullmatch(source)
    if match is None or match.group(1) not in _PER_TOKEN_ARGS:
        return None
    dim = match.group(2)
    return _PER_TOKEN_ARGS.index(match.group(1)), None if dim is None else int(dim)


#: A decode piece's results, each None where its graph computes it, else the index in _PER_TOKEN_ARGS
#: of the input it passes through (dynamo returns that input itself; the graph has no output for it)
Outputs = tuple[int | None, ...]
#: torch releases (major, minor) on which the direct call (:class:`_DirectGraph`) was checked: it
#: reads dynamo's record of where each graph input comes from, which is internal to torch. Other
#: releases compile with plain torch.compile.
DIRECT_CALL_TORCH = ((2, 13),)


def direct_calls_supported() -> bool:
    """True on the torch releases where decode pieces may skip dynamo after their first call."""
    return torch_release() in DIRECT_CALL_TORCH


def compile_mode(device: torch.device | str) -> str | None:
    """torch.compile mode: "reduce-overhead" (CUDA graphs) on a GPU, inductor's default on the CPU."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else None


class _StaticSlot:
    """A :class:`functional.KVCacheSlot` over one whole cache slot (B, 2·heads, max_length, D),
    attending over its first ``n_keys`` positions (all of them when None)."""

    def __init__(
        self,
        kv: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        n_keys: int | torch.SymInt | None = None,
    ) -> None:
        self.kv, self.positions, self.mask, self.n_keys = kv, positions, mask, n_keys

    def update(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        H = k.shape[1]
        # [k; v] along heads as two zero-padded sums rather than torch.cat: pads are pointwise, so
        # inductor fuses them (and RoPE) into the cache write instead of copying k and v first
        both = F.pad(k, (0, 0, 0, 0, 0, H)) + F.pad(v, (0, 0, 0, 0, H, 0))
        self.kv.index_copy_(2, self.positions, both)
        if self.mask is None:  # a chunk from position 0: plain causal over its own T keys, which
            # lets the fused attention skip the blocks above the diagonal (a mask over the whole slot
            # makes it compute them all)
            T = k.shape[2]
            return self.kv[:, :H, :T], self.kv[:, H:, :T], None
        if self.n_keys is None:
            return self.kv[:, :H], self.kv[:, H:], self.mask
        # narrow, not a slice: the key count must lie within the slot (a slice would clamp it)
        keys = self.kv.narrow(2, 0, self.n_keys)
        return keys[:, :H], keys[:, H:], self.mask


def _static_slots(
    kvs: tuple[torch.Tensor, ...],
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    n_keys: int | torch.SymInt | None = None,
) -> list[_StaticSlot]:
    return [_StaticSlot(kv, positions, mask, n_keys) for kv in kvs]


#: Core iterations one compiled decode graph unrolls at most. Compile time grows faster than the
#: graph, so a deeper token runs the prelude, chunks of at most this many iterations and the coda
#: as separate graphs: one or two distinct chunk graphs for any depth, at the cost of one launch
#: per extra graph.
MAX_UNROLLED_STEPS = 8


class _Piece(NamedTuple):
    """One compiled graph of a decode token: ``num_steps`` iterations, with the prelude (first)
    and/or the coda and head (last), over the cache slots of its layer calls."""

    num_steps: int
    first: bool
    last: bool
    slots: tuple[torch.Tensor, ...]
    slot_indices: tuple[int, ...]
    pattern: tuple[int, ...]  # slot_indices relative to the first (what the compile depends on)

    @property
    def key(self) -> tuple:
        """What the piece's compiled graph depends on, besides the cache and batch shapes."""
        return (self.num_steps, self.first, self.last, self.pattern)


def _decode_piece(
    w: LayerStack,
    x: torch.Tensor,
    positions: torch.Tensor,
    rope: torch.Tensor,
    state: torch.Tensor,
    slots: tuple[torch.Tensor, ...],
    key_valid: torch.Tensor | None,
    keys: torch.Tensor,
    num_steps: int,
    first: bool,
    last: bool,
) -> tuple[torch.Tensor, ...]:
    """One token per row through part of the forward recipe; the whole of it when first and last.

    x is the token ids (B, 1) when ``first`` (the prelude runs here), else the prelude's output e.
    Returns (float32 logits (B, 1, V), latents ln_f(s_r), the greedy tokens (B,)) when ``last``,
    else (state, e): the argmax in the graph saves a greedy decode two ops per token. ``slots``
    holds the cache slot of each of this piece's layer calls in order: views passed one by one, so
    that each write touches its slot only. The per-token host work is in the graph too: the RoPE row
    and the attention mask come from ``positions`` (1,), the whole RoPE table ``rope`` and the
    padding mask ``key_valid`` (B, L) or None. (On the CPU each eager op between two tokens runs
    with caches just flushed by the weights.) Attention reads the first ``len(keys)`` positions of
    each slot: on the CPU a length marked dynamic that covers the token's position, so that a token
    reads the cache written so far instead of the whole slot (see :func:`_key_ranges`).
    """
    n_keys = keys.shape[0]
    mask = attention_mask(positions, n_keys, key_valid)
    if key_valid is None:
        mask = mask[None, None]
    rope = rope.index_select(0, positions)
    calls = _static_slots(slots, positions, mask, n_keys)
    n_prelude, n_core = len(w.prelude) if first else 0, len(w.core)
    at = [stack.core_call_index(n_prelude, n_core, step, 0) for step in range(1, num_steps + 1)]
    parts = stack.SlotList(calls[:n_prelude], [calls[i : i + n_core] for i in at],
                           calls[len(calls) - len(w.coda) :] if last else [])  # fmt: skip
    out = stack.run(w, x, rope, num_steps, state, slots=parts, first=first, last=last)
    if last:
        return out.logits, out.latents, out.logits[:, -1].argmax(-1)
    return out.state, out.e


def _prefill_block(
    x: torch.Tensor,
    weights: Any,
    rope: torch.Tensor,
    eps: float,
    kv: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One sandwich block of a prompt chunk writing its keys/values into slot ``kv`` (B, 2·heads,
    L, D) at ``positions`` (compiled dynamic in the prompt length)."""
    return stack.layers(x, (weights,), rope, eps, _static_slots((kv,), positions, mask))


def _own_copy(function: Callable) -> Callable:
    """``function`` with a code object of its own. Dynamo keeps compiled graphs and their guards
    per code object, and stops compiling past ``recompile_limit`` graphs per code object; a copy per
    graph key holds that key's graphs alone, so no depth sweep or model count reaches the limit."""
    copy = types.FunctionType(
        function.__code__.replace(), function.__globals__, function.__name__,
        function.__defaults__, function.__closure__,
    )  # fmt: skip
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


class _Captured(NamedTuple):
    """What the recording backend keeps of the graph it built: its callable, where each input comes
    from (dynamo's source names, None where unknown) and its number of outputs."""

    run: Callable
    sources: tuple[str, ...] | None
    n_outputs: int


def _source_name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else name


#: Inductor options of the CPU graphs: a C++ launcher (a decode token is ~100 loops over ~60
#: inputs, for which a Python launcher costs far more), and one memory pool for the intermediate
#: buffers. A token fused into one kernel keeps all its intermediates alive at once, so inductor
#: cannot reuse them; without the pool the launcher allocates and frees each one per call, and with
#: it still makes a tensor of each (:mod:`.inductor_pool_pointers` makes them pointers).
# size_asserts off: dynamo's guards check the inputs of every guarded call and the direct decode
# callers check theirs once per caller or per token (_DirectEntry.caller, CompiledDecode.token),
# where the launcher would check all ~60 of a token's inputs on every call.
# cpp.min_chunk_size: inductor splits a loop between the threads only when each gets at least this
# many elements (512 by default), and runs a smaller one on one thread while the others wait at the
# next barrier. A pointwise loop between two shared loops (the small preset's MLP activation, 704
# values between its two products) waits at the same barriers either way, so splitting it halves
# its time; 352 splits that one and keeps the 512-value loops inside serial chains (RoPE, cache
# writes) whole, where splitting would add barriers.
CPU_OPTIONS = {
    "cpp_wrapper": True,
    "memory_planning": True,
    "size_asserts": False,
    "cpp.min_chunk_size": 352,
}


def cpu_options() -> dict[str, Any]:
    """``CPU_OPTIONS``, the vector ISA picked here (:mod:`.inductor_isa`) and, on the torch
    releases they were checked on, one barrier per run of a kernel's serial loops instead of one per
    loop (:mod:`.inductor_serial_chains`), pooled intermediates as raw pointers in the C++
    launcher (:mod:`.inductor_pool_pointers`) and a launcher entry that takes raw pointers
    (:mod:`.inductor_raw_entry`)."""
    return {
        **CPU_OPTIONS,
        **isa_options(),
        **inductor_serial_chains.compile_options(),
        **inductor_pool_pointers.compile_options(),
        **inductor_raw_entry.compile_options(),
    }


class _RecordingInductor:
    """A dynamo backend: inductor with :func:`cpu_options` that keeps, for the graph it just built,
    what a direct call needs (:class:`_Captured`)."""

    def __init__(self) -> None:
        self.captured: _Captured | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        from torch._inductor.compile_fx import compile_fx  # the compiler loads on first use only

        run = compile_fx(gm, example_inputs, config_patches=cpu_options())
        try:
            placeholders = gm.graph.find_nodes(op="placeholder")
            sources = tuple(_source_name(n.meta["grapharg"].source) for n in placeholders)
        except (KeyError, AttributeError):  # not dynamo's graph layout: no direct calls
            sources = None
        self.captured = _Captured(run, sources, len(gm.graph.output_node().args[0]))
        return run


_SOURCE_STEP = re.compile(r"\[(\d+)\]|\.([A-Za-z_]\w*)")


def resolve_source(source: str, args: dict[str, Any]) -> Any:
    """The object a dynamo source name such as ``L['w'][3][0]`` or ``L['w'].core[1]`` points to
    in the piece's arguments ``args``; KeyError for any other form."""
    head = re.match(r"L\['(\w+)'\]", source)
    if head is None or head.group(1) not in args:
        raise KeyError(source)
    value, at = args[head.group(1)], head.end()
    while at < len(source):
        step = _SOURCE_STEP.match(source, at)
        if step is None:
            raise KeyError(source)
        index, attribute = step.groups()
        value = value[int(index)] if index is not None else getattr(value, attribute)
        at = step.end()
    return value


class _DirectGraph:
    """One decode piece's compiled graph called without dynamo's per-call work.

    Every input but the per-token ones (``_PER_TOKEN_ARGS``) is the same object on every token, and
    those have fixed shapes but for the key count (passed as its size), so dynamo's guards over the
    ~60 inputs and its Python wrappers decide nothing after the first call. In inference mode the
    call skips AOT autograd's wrappers too where they were found and checked (``boxed``,
    :mod:`.inductor_boxed`), and passes the key count as a tensor made once per count, which the
    graph's C++ launcher would make on every call; where its launcher has a raw entry
    (:mod:`.inductor_raw_entry`, checked like ``boxed``) the call goes through that, with the fixed
    inputs' addresses written once. The launcher does not check the inputs' sizes
    and strides (``size_asserts`` off): the fixed inputs are checked once per caller
    (:meth:`_DirectEntry.caller`), the per-token ones by :meth:`CompiledDecode.token`.
    A piece that passes an input through (the prelude piece's s_0, a middle chunk's e) returns that
    input as dynamo did.
    """

    def __init__(
        self,
        run: Callable,
        sources: tuple[str, ...],
        outputs: Outputs,
        args: tuple,
        boxed: Callable[[list], Any] | None = None,
        raw: RawEntry | None = None,
    ) -> None:
        named = dict(zip(_PIECE_ARGS, args, strict=False))
        self.run, self.outputs, self.boxed = run, outputs, boxed
        self.size_tensors: dict[int, torch.Tensor] = {}  # per size input's value
        self.inputs: list[Any] = []
        self.per_token: list[tuple[int, int, int | None]] = []  # (input, argument, size dim)
        for i, src in enumerate(sources):
            at = per_token_source(src)
            self.inputs.append(None if at is not None else resolve_source(src, named))
            if at is not None:
                self.per_token.append((i, *at))
        self.raw = None if raw is None else RawCall(raw, self.inputs)

    def graph_inputs(self, per_token: tuple[torch.Tensor | None, ...]) -> list[Any]:
        """The compiled graph's inputs for this token's per-token arguments."""
        inputs = list(self.inputs)
        for i, which, dim in self.per_token:
            value = per_token[which]
            inputs[i] = value if dim is None else value.shape[dim]  # type: ignore[union-attr]
        return inputs

    def token_inputs(
        self, per_token: tuple[torch.Tensor | None, ...]
    ) -> list[tuple[int, torch.Tensor]]:
        """(graph input, tensor) for each input that changes per token, each size a 0-dim int64
        tensor made once per value: what the boxed graph's C++ launcher makes of an integer input
        (``torch.tensor``) on every call."""
        inputs = []
        for i, which, dim in self.per_token:
            value = per_token[which]
            if dim is not None:
                size = value.shape[dim]  # type: ignore[union-attr]
                value = self.size_tensors.get(size)
                if value is None:
                    value = self.size_tensors[size] = torch.tensor(size, device="cpu")
            inputs.append((i, value))
        return inputs

    def boxed_inputs(self, per_token: tuple[torch.Tensor | None, ...]) -> list[Any]:
        """The boxed graph's inputs for this token's per-token arguments (:meth:`token_inputs`)."""
        inputs = list(self.inputs)
        for i, value in self.token_inputs(per_token):
            inputs[i] = value
        return inputs

    def __call__(
        self, *per_token: torch.Tensor | None, into: OutputBuffers | None = None
    ) -> tuple[torch.Tensor, ...]:
        """The piece's results for this token's per-token arguments: its computed ones in ``into``
        (the raw call's :meth:`~RawCall.buffers`) where the raw entry runs, else in new tensors."""
        if self.raw is not None and torch.is_inference_mode_enabled():
            computed = iter(self.raw(self.token_inputs(per_token), into))
        elif self.boxed is not None and torch.is_inference_mode_enabled():
            computed = iter(self.boxed(self.boxed_inputs(per_token)))
        else:
            computed = iter(self.run(*self.graph_inputs(per_token)))
        return tuple(next(computed) if i is None else per_token[i] for i in self.outputs)


Layout = tuple[torch.Size, tuple[int, ...], torch.dtype, torch.device] | None


def _layouts(inputs: list[Any]) -> tuple[Layout, ...]:
    """Each tensor input's sizes, strides, dtype and device (None for other inputs): what the
    compiled graph was built for and its launcher, built without size asserts, does not check."""
    return tuple(
        (x.shape, x.stride(), x.dtype, x.device) if isinstance(x, torch.Tensor) else None
        for x in inputs
    )


class _DirectEntry(NamedTuple):
    run: Callable
    sources: tuple[str, ...]
    outputs: Outputs
    boxed: Callable[[list], Any] | None
    layouts: tuple[Layout, ...]  # the fixed inputs' layouts at the graph's first call
    raw: RawEntry | None

    def caller(self, args: tuple) -> _DirectGraph | None:
        """The graph's direct caller for a piece's arguments ``args``; None where a fixed input
        (a weight, a cache slot) is not laid out as when the graph was built, which only dynamo's
        guards may then decide."""
        direct = _DirectGraph(self.run, self.sources, self.outputs, args, self.boxed, self.raw)
        return direct if _layouts(direct.inputs) == self.layouts else None


class _CompiledFunction(NamedTuple):
    """A torch.compile'd copy of a piece function and, for the decode on the CPU, its recorder."""

    call: Callable
    recorder: _RecordingInductor | None


def _sum_written_products(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """x @ wᵀ summed over ``weights`` as :func:`functional.linear` writes a compiled one-row
    product (a multiply-and-sum)."""
    return sum(fn.linear(x, w) for w in weights)  # type: ignore[return-value]


def _matvec_products(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """The same products with torch's matrix-vector kernel."""
    return sum(F.linear(x, w) for w in weights)  # type: ignore[return-value]


#: Distinct copies of a weight one measurement streams through (one graph input each): enough
#: that most reads miss the core's own cache, as a decode token's do, and that the call's fixed
#: cost is shared. The fastest of PRODUCT_REPEATS rounds counts, the two products alternating
#: within each round so that load changes hit both alike.
PRODUCT_COPIES, PRODUCT_REPEATS = 8, 9
#: torch's matrix-vector product replaces the sum-written one only when this much faster: within
#: the measurement's noise the fused sum-written product stays (it keeps the token one kernel).
MATVEC_MARGIN = 0.9


class ProductTiming(NamedTuple):
    """Seconds per weight of one batch-1 product shape, per round: {"sum": …, "matvec": …}, the
    two measured back to back in each round so that a change of load hits both alike."""

    rounds: tuple[dict[str, float], ...]

    @property
    def best(self) -> dict[str, float]:
        """Each product's fastest round."""
        return {name: min(r[name] for r in self.rounds) for name in self.rounds[0]}

    @property
    def paired_ratio(self) -> float:
        """The median over rounds of matvec time / sum-written time (paired within a round)."""
        ratios = sorted(r["matvec"] / r["sum"] for r in self.rounds)
        return ratios[len(ratios) // 2]


class ProductChoice(NamedTuple):
    """The product a compiled batch-1 projection uses ("sum" or "matvec") and why, in words."""

    product: str
    reason: str


def choose_product(timing: ProductTiming) -> ProductChoice:
    """torch's matrix-vector product where it beats the sum-written one by ``MATVEC_MARGIN`` both
    in the median of the paired rounds and best over best; else the sum-written product.

    Requiring both estimators keeps one disturbed round (another process on the cores during one
    product's turn) from deciding a shape for the rest of the process."""
    best = timing.best
    paired, over_best = timing.paired_ratio, best["matvec"] / best["sum"]
    evidence = (f"matvec/sum-written time {paired:.2f} (median of {len(timing.rounds)} paired "
                f"rounds), {over_best:.2f} best over best")  # fmt: skip
    if paired < MATVEC_MARGIN and over_best < MATVEC_MARGIN:
        return ProductChoice("matvec", f"{evidence}: both below {MATVEC_MARGIN}")
    return ProductChoice(
        "sum", f"{evidence}: not both below {MATVEC_MARGIN}, the fused product stays"
    )


#: The token check (:func:`check_on_tokens`): rounds, and tokens per variant in each round.
TOKEN_CHECK_ROUNDS, TOKEN_CHECK_TOKENS = 5, 3


class TokenCheck(NamedTuple):
    """Whole decode tokens with torch's products at ``shapes`` against every product sum-written
    (``timing``: seconds per token, "matvec" and "sum" per round) and the decision."""

    shapes: tuple[tuple[int, int], ...]
    timing: ProductTiming
    choice: ProductChoice


def time_tokens(decodes: dict[str, CompiledDecode], rounds: int, tokens: int) -> ProductTiming:
    """Seconds per decode token of each of ``decodes`` (same model and cache), ``tokens`` tokens at
    positions 0… per turn, the decodes alternating within each of ``rounds`` rounds after one
    untimed turn each (which compiles)."""
    ids = torch.zeros(decodes["sum"].cache.kv.shape[1], 1, dtype=torch.long,
                      device=decodes["sum"].model.device)  # fmt: skip

    def turn(decode: CompiledDecode) -> float:
        t0 = time.perf_counter()
        for position in range(tokens):
            decode(ids, position, None)
        return (time.perf_counter() - t0) / tokens

    with torch.inference_mode():
        for decode in decodes.values():
            turn(decode)
        return ProductTiming(tuple({n: turn(d) for n, d in decodes.items()} for _ in range(rounds)))


def check_on_tokens(decode: CompiledDecode, shapes: tuple[tuple[int, int], ...]) -> TokenCheck:
    """Whether torch's products at ``shapes`` (faster alone, :meth:`CompileState.matvec_shapes`)
    also make ``decode``'s whole token faster than every product sum-written.

    Each such product leaves the token's one fused kernel: the token becomes a kernel per layer call
    with an extern call between them, a cost the products timed alone do not carry. So both tokens
    are compiled and timed (:func:`time_tokens`) and judged as products are
    (:func:`choose_product`). The tokens write the decode's cache at their positions, which are
    restored afterwards."""
    cache = decode.cache
    decodes = {
        name: CompiledDecode(decode.model, cache, decode.num_steps, decode.mode, matvec=matvec)
        for name, matvec in (("matvec", shapes), ("sum", ()))
    }
    tokens = min(TOKEN_CHECK_TOKENS, cache.max_length)
    written = cache.kv[:, :, :, :tokens]  # (slots, B, 2·heads, positions, head_dim)
    saved, span = written.clone(), (cache.start, cache.end, cache.is_causal, cache.mask)
    try:
        timing = time_tokens(decodes, TOKEN_CHECK_ROUNDS, tokens)
    finally:
        written.copy_(saved)
        cache.start, cache.end, cache.is_causal, cache.mask = span
    decode.compile_seconds += sum(d.compile_seconds for d in decodes.values())
    return TokenCheck(shapes, timing, choose_product(timing))


#: The compiled timing graphs of one :class:`CompileState`, by ("sum" | "matvec", shape, dtype).
TimingFunctions = dict[tuple[str, tuple[int, int], torch.dtype], Callable]


def _timing_function(
    name: str, shape: tuple[int, int], dtype: torch.dtype, functions: TimingFunctions
) -> Callable:
    """The compiled "sum" or "matvec" products of weights of ``shape`` in ``dtype`` for
    :func:`time_products`, built on first use into ``functions``, each a static graph on a code
    object of its own (:func:`_own_copy`). A graph shared across shapes would run every shape with
    the loop parallelisation inductor chose from the first shape's sizes, and each shape it
    retraces counts against dynamo's limit of graphs per code object. Another state's graph of the
    same shape compiles from inductor's graph cache."""
    key = (name, shape, dtype)
    if key not in functions:
        target = _sum_written_products if name == "sum" else _matvec_products
        functions[key] = torch.compile(
            _own_copy(target),
            dynamic=False,
            fullgraph=True,
            options={"cpp_wrapper": True, **isa_options()},
        )
    return functions[key]


def time_products(
    shape: tuple[int, int], dtype: torch.dtype, functions: TimingFunctions
) -> ProductTiming:
    """Seconds of one batch-1 product with a weight of ``shape`` (out, in) on the CPU, inside a
    compiled graph: sum-written ("sum") and torch's matrix-vector product ("matvec"); per weight,
    in each of ``PRODUCT_REPEATS`` interleaved rounds over ``PRODUCT_COPIES`` weights. The
    graphs are kept in ``functions`` (a :class:`CompileState`'s)."""
    g = torch.Generator().manual_seed(0)
    calls = {name: _timing_function(name, shape, dtype, functions) for name in ("sum", "matvec")}
    rounds = []
    # inference tensors whether or not the caller is in inference mode: one graph per shape
    with torch.inference_mode():
        weights = [torch.randn(shape, generator=g).to(dtype) for _ in range(PRODUCT_COPIES)]
        x = torch.randn(1, 1, shape[1], generator=g).to(dtype)
        for call in calls.values():
            call(x, weights)  # compiles on the shape's first measurement in this process
        for _ in range(PRODUCT_REPEATS):
            seconds = {}
            for name, call in calls.items():
                t0 = time.perf_counter()
                call(x, weights)
                seconds[name] = (time.perf_counter() - t0) / PRODUCT_COPIES
            rounds.append(seconds)
    return ProductTiming(tuple(rounds))


class CompileState:
    """What the compiled path keeps for one model, across generate calls.

    - the static cache storage (CUDA graphs need inputs at fixed addresses), one shape at a time;
    - one compiled function per graph key (:func:`_own_copy`), and which keys have compiled;
    - the decode graphs callable without dynamo (:class:`_DirectGraph`), per graph key;
    - per projection shape, the measured choice of a CPU batch-1 product (:meth:`matvec_shapes`)
      and the compiled graphs that timed it; per token graph, the whole-token check of torch's
      products where they were faster alone (:func:`check_on_tokens`).
    """

    def __init__(self) -> None:
        self.products: dict[tuple[tuple[int, int], torch.dtype], ProductTiming] = {}
        self.token_checks: dict[tuple, TokenCheck] = {}
        self.timing_functions: TimingFunctions = {}
        self.storage: tuple[tuple, torch.Tensor] | None = None
        self.functions: dict[tuple, _CompiledFunction] = {}
        self.compiled: set[tuple] = set()
        self.direct: dict[tuple, _DirectEntry] = {}
        self.noted_fallback = False

    def static_storage(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, n_core: int
    ) -> torch.Tensor:
        """Zeroed cache storage of ``shape``, reused across calls with the same shape."""
        key = (shape, dtype, device)
        if self.storage is not None and self.storage[0] == key:
            return self.storage[1].zero_()
        self.storage = None  # free the previous shape's storage before allocating
        check_fits(shape, dtype, device, n_core)
        storage = torch.zeros(shape, dtype=dtype, device=device)
        if storage.is_cuda:
            torch._dynamo.mark_static_address(storage)
        self.storage = (key, storage)
        return storage

    def matvec_shapes(
        self, config: RecurrentConfig, dtype: torch.dtype
    ) -> tuple[tuple[int, int], ...]:
        """The weight shapes of ``config`` (its cost model's) whose batch-1 CPU products in
        ``dtype`` run faster as torch's matrix-vector product than sum-written
        (:func:`choose_product`), each shape measured once (:func:`time_products`)."""
        chosen = []
        for shape in sorted(set(config.cost.weight_shapes().values())):
            key = (shape, dtype)
            if key not in self.products:
                self.products[key] = time_products(shape, dtype, self.timing_functions)
            if choose_product(self.products[key]).product == "matvec":
                chosen.append(shape)
        return tuple(chosen)

    def function(self, which: str, key: tuple, mode: str | None) -> _CompiledFunction:
        """The compiled "decode" piece or "prefill" block for graph ``key`` (built on first use).

        On the CPU inductor builds it with :func:`cpu_options`; the CPU decode's inductor also records
        what a direct call needs, on the torch releases where that was checked.
        """
        held = self.functions.get((which, key))
        if held is not None:
            return held
        target, dynamic = (_decode_piece, False) if which == "decode" else (_prefill_block, None)
        target = _own_copy(target)
        recorder = None
        if which == "decode" and mode is None and self._direct_calls():
            recorder = _RecordingInductor()
            call = torch.compile(target, backend=recorder, dynamic=dynamic, fullgraph=True)
        else:
            options = cpu_options() if mode is None else None
            call = torch.compile(
                target, mode=mode, dynamic=dynamic, fullgraph=True, options=options
            )
        held = self.functions[(which, key)] = _CompiledFunction(call, recorder)
        return held

    def first_call(self, key: tuple, call: Callable, *args: Any) -> tuple[Any, float]:
        """``call(*args)`` and the seconds it took when graph ``key`` compiles in it (its first
        call in this state), else 0."""
        if key in self.compiled:
            return call(*args), 0.0
        t0 = time.perf_counter()
        out = call(*args)
        self.compiled.add(key)
        return out, time.perf_counter() - t0

    def _direct_calls(self) -> bool:
        if direct_calls_supported():
            return True
        if not self.noted_fallback:
            self.noted_fallback = True
            checked = ", ".join(f"{a}.{b}" for a, b in DIRECT_CALL_TORCH)
            warnings.warn(
                f"compiled decode: torch {torch.__version__} is not a release the dynamo bypass "
                f"was checked on ({checked}); every token goes through torch.compile's guards",
                RuntimeWarning,
                stacklevel=3,
            )
        return False

    def direct_graph(
        self, key: tuple, captured: _Captured | None, args: tuple, out: tuple
    ) -> _DirectGraph | None:
        """A direct caller of the graph that just ran ``args`` for ``key`` (None where there is none).

        The graph is the one ``captured`` during that call, or one found earlier for ``key``. A newly
        captured graph must output exactly the results that are not per-token inputs passed
        through, and is first rerun on the same inputs to give the same outputs (rewriting this
        token's cache entries with the same values).
        """
        if captured is None:
            entry = self.direct.get(key)
            return None if entry is None else entry.caller(args)
        named = dict(zip(_PIECE_ARGS, args, strict=False))
        per_token = [named[name] for name in _PER_TOKEN_ARGS]
        outputs = tuple(next((i for i, t in enumerate(per_token) if t is o), None) for o in out)
        fixed = ("L['w']", "L['rope']", "L['slots']")  # what stays the same object every token
        sources = captured.sources
        if (
            sources is None
            or captured.n_outputs != outputs.count(None)
            or not all(per_token_source(src) or src.startswith(fixed) for src in sources)
        ):
            return None
        try:
            direct = _DirectGraph(captured.run, sources, outputs, args)
        except (KeyError, IndexError, AttributeError, TypeError):  # a source we cannot follow
            return None
        again = direct(*per_token)
        if not _same_tensors(again, out):
            return None
        computed = [o for o, i in zip(out, outputs, strict=True) if i is None]
        direct.boxed = _checked_boxed(direct, per_token, computed)
        direct.raw = _checked_raw(direct, per_token, computed)
        raw = None if direct.raw is None else direct.raw.entry
        layouts = _layouts(direct.inputs)
        self.direct[key] = _DirectEntry(captured.run, sources, outputs, direct.boxed, layouts, raw)
        return direct


def _checked_boxed(
    direct: _DirectGraph, per_token: list[torch.Tensor | None], computed: list[torch.Tensor]
) -> Callable[[list], Any] | None:
    """The boxed callable of ``direct``'s graph under torch.compile's wrappers
    (:func:`inductor_boxed.boxed_graph`) if, called in inference mode on this token's inputs as the
    direct call passes them (:meth:`_DirectGraph.boxed_inputs`), it returns exactly the graph's
    ``computed`` outputs (as many, the same values); else None. Only checked in inference mode,
    where it would be used."""
    boxed = boxed_graph(direct.run) if torch.is_inference_mode_enabled() else None
    if boxed is None:
        return None
    again = boxed(direct.boxed_inputs(tuple(per_token)))
    return boxed if _same_tensors(again, computed) else None


def _checked_raw(
    direct: _DirectGraph, per_token: list[torch.Tensor | None], computed: list[torch.Tensor]
) -> RawCall | None:
    """``direct``'s graph called through the raw entry of its checked boxed graph's launcher
    (:mod:`.inductor_raw_entry`) if, called on this token's inputs, it returns exactly the graph's
    ``computed`` outputs (the same layouts, the same values); else None."""
    if direct.boxed is None:
        return None
    entry = RawEntry.load(direct.boxed, computed)
    if entry is None:
        return None
    call = RawCall(entry, direct.inputs)
    try:
        again = call(direct.token_inputs(tuple(per_token)))
    except RuntimeError:  # it refused its outputs' sizes or a kernel threw: inductor's entry stays
        return None
    same_layouts = all(a.stride() == b.stride() for a, b in zip(again, computed, strict=True))
    return call if same_layouts and _same_tensors(again, computed) else None


def _same_tensors(a: Any, b: Any) -> bool:
    """Whether two sequences of tensors are as long and equal element by element."""
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def compile_state(model: RecurrentLM) -> CompileState:
    """``model``'s :class:`CompileState` (made on first use, kept on the model)."""
    state = getattr(model, "_compile_state", None)
    if state is None:
        state = model._compile_state = CompileState()
    return state


#: Key positions a CPU decode token reads come in whole blocks of this many (see _key_ranges).
KEY_BLOCK = 16


def _key_ranges(length: int, device: torch.device, dynamic: bool) -> list[torch.Tensor]:
    """Per cache position, the key positions a decode token there attends over.

    Under CUDA graphs (not ``dynamic``) shapes are static: every token reads all ``length``. Else a
    token reads the positions up to its own, rounded up to a whole ``KEY_BLOCK`` (the positions past
    it are masked), as views of one ``arange`` whose length is marked dynamic, so that one compiled
    graph serves every length and a token early in a long cache does not stream the cache's unwritten
    rest. The whole length stays unmarked: there the narrowed cache view is contiguous, which a
    trace would check and fix as a constant, so a graph traced at a shorter length guards it out and
    dynamo gives the whole length a graph of its own; the direct callers run the dynamic graph at
    every length (:meth:`CompiledDecode._compiled_piece`).
    """
    every = torch.arange(length, device=device)
    if not dynamic:
        return [every] * length
    views = {length: every}
    for n in range(KEY_BLOCK, length, KEY_BLOCK):
        views[n] = every[:n]
        torch._dynamo.mark_dynamic(views[n], 0)
    return [views[min(length, -(-(p + 1) // KEY_BLOCK) * KEY_BLOCK)] for p in range(length)]


class DecodedToken(NamedTuple):
    """A compiled decode token's results."""

    logits: torch.Tensor  # (B, 1, V), float32
    latents: torch.Tensor  # ln_f(s_r), (B, 1, h)
    greedy: torch.Tensor  # (B,) the logits' argmax, taken in the graph


class CompiledDecode:
    """Fixed-depth chunks of ``model`` over ``cache``: compiled decode token, per-layer prefill."""

    def __init__(
        self,
        model: RecurrentLM,
        cache: KVCache,
        num_steps: int,
        mode: str | None = None,
        matvec: fn.MatvecShapes | None = None,
    ) -> None:
        """``matvec``: the weight shapes a batch-1 CPU token multiplies with torch's
        matrix-vector product; None: those faster here, alone and in the whole token
        (:meth:`CompileState.matvec_shapes`, :func:`check_on_tokens`)."""
        if num_steps > cache.max_steps:
            raise ValueError(f"num_steps {num_steps} exceeds the cache's {cache.max_steps} steps")
        self.model, self.cache, self.num_steps, self.mode = model, cache, num_steps, mode
        slots = cache.kv_slots
        n_coda = cache.n_coda
        prelude = [cache.physical(i) for i in range(cache.n_prelude)]
        core = [[cache.core_slot(step, j) for j in range(cache.n_core)]
                for step in range(1, num_steps + 1)]  # fmt: skip
        coda = [cache.physical(k - n_coda) for k in range(n_coda)]
        self.prelude_slots = [slots[i] for i in prelude]
        self.core_slots = [[slots[i] for i in step] for step in core]
        self.coda_slots = [slots[i] for i in coda]
        self.pieces = self._plan(slots, prelude, core, coda)
        self.state = compile_state(model)
        self.weights = LayerStack.of(model)
        measure = matvec is None and cache.kv.shape[1] == 1
        measure = measure and model.device.type == "cpu" and mode is None
        if measure:  # each projection shape as whichever product is faster here, checked below
            matvec = self.state.matvec_shapes(model.config, model.dtype)
        self.weights = self.weights._replace(matvec=tuple(matvec or ()))
        # what a decode token reads besides its ids: the whole RoPE table (the graph picks its row)
        # and one position tensor per cache position, built once instead of per token
        self.rope = torch.view_as_real(model.rope_at(0, cache.max_length))
        self.positions = torch.arange(cache.max_length, device=model.device).split(1)
        self.keys = _key_ranges(cache.max_length, model.device, dynamic=mode is None)
        self.dtype = model.dtype  # read per token: the model's property walks its parameters
        self.shape_key = (cache.kv.shape[1], cache.max_length, self.dtype, mode)
        self.token_shape = (cache.kv.shape[1], 1)
        # ids laid out as the graph reads them are taken as they are, the greedy tokens of the
        # previous token included; not under CUDA graphs, whose next replay reuses their memory
        self.reuse_ids = mode is None
        self.zero_state: torch.Tensor | None = None
        self.direct: dict[int, _DirectGraph | None] = {}  # per piece, once looked up
        self.compile_seconds = 0.0
        if measure and self.weights.matvec:  # on whole tokens, once the decode can run them
            self.weights = self.weights._replace(matvec=self._checked(self.weights.matvec))

    def _checked(self, shapes: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        """``shapes`` if their torch products also make the whole token faster, else none
        (:func:`check_on_tokens`, once per shapes and token graph in the model's state)."""
        key = (shapes, self.shape_key, self.num_steps, self.cache.kv.shape)
        if key not in self.state.token_checks:
            self.state.token_checks[key] = check_on_tokens(self, shapes)
        return shapes if self.state.token_checks[key].choice.product == "matvec" else ()

    @staticmethod
    def _plan(
        slots: list[torch.Tensor], prelude: list[int], core: list[list[int]], coda: list[int]
    ) -> list[_Piece]:
        """The graphs of one decode token over these slot indices (prelude, per core step, coda):
        the whole token when there are ≤ MAX_UNROLLED_STEPS steps, else the prelude, near-equal
        chunks of iterations, and the coda."""

        def piece(steps: int, first: bool, last: bool, indices: list[int]) -> _Piece:
            # slot indices relative to the first: chunks laid out alike share one graph
            pattern = tuple(i - indices[0] for i in indices)
            views = tuple(slots[i] for i in indices)
            return _Piece(steps, first, last, views, tuple(indices), pattern)

        num_steps = len(core)
        if num_steps <= MAX_UNROLLED_STEPS:
            return [piece(num_steps, True, True, prelude + sum(core, []) + coda)]
        n_chunks = -(-num_steps // MAX_UNROLLED_STEPS)
        size = -(-num_steps // n_chunks)
        chunks = [core[i : i + size] for i in range(0, num_steps, size)]
        return [
            piece(0, True, False, prelude),
            *(piece(len(c), False, False, sum(c, [])) for c in chunks),
            piece(0, False, True, coda),
        ]

    def __call__(
        self, ids: torch.Tensor, start: int, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` (B, T) at positions start… from s_0 = ``state`` (None: zeros):
        (logits (B, 1, V), latents)."""
        B, T = ids.shape
        if T == 1:
            logits, latents, _ = self.token(ids, start, state)
            return logits, latents
        self._begin(start, T)
        if state is None:
            state = torch.zeros(B, T, self.model.config.n_embd, device=ids.device, dtype=self.dtype)
        return self._prefill(ids, start, state)

    def _begin(self, start: int, length: int) -> None:
        self.cache.begin(start, length)  # checks that the positions fit
        if self.mode == "reduce-overhead":  # a new CUDA-graph tree step: earlier outputs are done
            torch.compiler.cudagraph_mark_step_begin()

    def token(
        self,
        ids: torch.Tensor,
        start: int,
        state: torch.Tensor | None,
        into: OutputBuffers | None = None,
    ) -> DecodedToken:
        """One decode token, ids (B, 1) at position ``start`` from s_0 = ``state`` (None: zeros):
        the graphs of ``pieces`` in turn, with as little host work as possible. ``into``
        (:meth:`output_buffers`): where the last piece writes its results when it runs through
        its raw entry (the caller keeps them no longer than it reuses them), else new tensors."""
        if ids.shape != self.token_shape or ids.dtype != torch.long:
            raise ValueError(f"a decode token takes {self.token_shape} int64 ids, got "
                             f"{tuple(ids.shape)} {ids.dtype}")  # fmt: skip
        x = ids
        if not (self.reuse_ids and ids.stride() == (1, 1) and ids.is_inference()):
            x = ids.reshape(-1).clone().view(ids.shape)  # the same strides and mode for every token
        self._begin(start, 1)
        if state is None:  # s_0 = 0: one zero tensor, made in the caller's mode, serves every token
            if self.zero_state is None:
                self.zero_state = torch.zeros(*ids.shape, self.model.config.n_embd,
                                              device=ids.device, dtype=self.dtype)  # fmt: skip
            state = self.zero_state
        elif state.shape != (*ids.shape, self.model.config.n_embd):
            raise ValueError(f"s_0 of shape {tuple(state.shape)} for ids of {tuple(ids.shape)}")
        else:  # one layout for every token (a prefill's last latent is a strided view)
            state = state.contiguous()
        positions, key_valid, keys = self.positions[start], self.cache.key_valid, self.keys[start]
        out: tuple[torch.Tensor, ...] = ()
        last = len(self.pieces) - 1
        for i, piece in enumerate(self.pieces):
            direct = self.direct.get(i)
            if direct is not None and state.dtype == self.dtype:
                out = direct(x, positions, state, key_valid, keys, into=into if i == last else None)
            else:
                key = (*self.shape_key, key_valid is None, self.weights.matvec, *piece.key)
                args = (self.weights, x, positions, self.rope, state, piece.slots, key_valid, keys,
                        piece.num_steps, piece.first, piece.last)  # fmt: skip
                out = self._compiled_piece(i, key, args)
            state, x = out[0], out[1]
        return DecodedToken(*out)  # the last piece's (logits, latents, greedy tokens)

    def output_buffers(self) -> OutputBuffers | None:
        """Tensors for :meth:`token`'s ``into``, once its last piece is called through a raw entry
        (from its second token on); else None."""
        direct = self.direct.get(len(self.pieces) - 1)
        return None if direct is None or direct.raw is None else direct.raw.buffers()

    def _compiled_piece(self, i: int, key: tuple, args: tuple) -> tuple[torch.Tensor, ...]:
        """Piece ``i`` through its compiled graph for ``key``: called directly when one was found
        for the key before, else through torch.compile (compiling on the key's first call) and its
        direct caller looked up."""
        per_token = [args[_PIECE_ARGS.index(name)] for name in _PER_TOKEN_ARGS]
        same_dtype = per_token[_PER_TOKEN_ARGS.index("state")].dtype == self.dtype
        if self.mode is None and key in self.state.direct and same_dtype:
            direct = self.direct[i] = self.state.direct_graph(key, None, args, ())
            if direct is not None:
                return direct(*per_token)
        decode = self.state.function("decode", key, self.mode)
        if decode.recorder is not None:
            decode.recorder.captured = None
        traced = args
        at = _PIECE_ARGS.index("keys")
        whole = args[at] is self.keys[-1] and args[at] is not self.keys[0]
        if key not in self.state.compiled and whole:
            # The whole slot's length is the one key count left static (see _key_ranges): trace
            # the graph at the shortest length, then rerun the token through its direct caller.
            # Each token writes only its own cache position, so the rerun overwrites the trace's.
            traced = (*args[:at], self.keys[0], *args[at + 1 :])
        out = self._timed(key, decode.call, traced)
        if i not in self.direct and self.mode is None:
            captured = decode.recorder.captured if decode.recorder is not None else None
            self.direct[i] = self.state.direct_graph(key, captured, traced, out)
        if traced is not args:
            direct = self.direct.get(i)
            # without a direct caller dynamo compiles the whole length's own graph now
            out = (
                direct(*per_token)
                if direct is not None
                else self._timed((*key, "whole"), decode.call, args)
            )
        return out

    def _timed(self, key: tuple, call: Callable, args: tuple) -> Any:
        out, seconds = self.state.first_call(key, call, *args)
        self.compile_seconds += seconds
        return out

    def _prefill(
        self, ids: torch.Tensor, start: int, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A prompt chunk through the forward recipe, one compiled sandwich block per layer call."""
        m, c, w = self.model, self.cache, self.weights
        T = ids.shape[1]
        rope = torch.view_as_real(m.rope_at(start, T))  # (T, head_dim / 2, 2): cos, sin
        positions = torch.arange(start, start + T, device=ids.device)
        mask: torch.Tensor | None = None  # from position 0 unpadded: causal, no mask to read
        if c.key_valid is not None or start > 0:
            mask = attention_mask(positions, c.max_length, c.key_valid)
            if c.key_valid is None:
                mask = mask[None, None]
        key = (*self.shape_key, c.key_valid is None, mask is None)
        compiled = self.state.function("prefill", key, self.mode).call

        def block(x: torch.Tensor, weights: Any, rope: torch.Tensor, eps: float, kv: Any,
                  *_: Any) -> torch.Tensor:  # fmt: skip
            return compiled(x, weights, rope, eps, kv, positions, mask)

        slots = stack.SlotList(self.prelude_slots, self.core_slots, self.coda_slots)

        def chunk(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = stack.run(w, ids, rope, self.num_steps, state, slots=slots, block=block,
                            last_only=True)  # fmt: skip
            return out.logits, out.latents

        return self._timed((*key, T), chunk, (state,))  # a new prompt length may compile
