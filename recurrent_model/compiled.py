"""Fixed-depth decoding through static-shape functions compiled with torch.compile.

Both call the :mod:`recurrent_model.functional` layers over a KV-cache slot that has a static shape:
keys and values are written into the whole preallocated slot with ``index_copy_`` at the chunk's
positions and attention reads all ``max_length`` positions under a mask (a prompt chunk from
position 0 attends causally over its own keys instead, so the fused attention skips the blocks above
the diagonal).

- A decode step (one token per row) is one compiled graph: embedding, prelude, ``num_steps`` core
  iterations, coda and head, so a token costs one call instead of ~25 torch calls per layer. A token
  deeper than ``MAX_UNROLLED_STEPS`` runs as a few such graphs (prelude, chunks of iterations, coda).
- A prompt prefill calls one compiled sandwich block per layer (weights, slot, positions and mask
  are its inputs, so one graph serves every layer and prompt length); at prompt lengths the matmuls
  dominate, and the block compiles in seconds where a whole prefill graph takes minutes.

Inductor fuses the element-wise work (norms, RoPE, SiLU, residual adds, the cache write). On the CPU
a batch-1 decode token becomes a single C++ kernel with a C++ launcher (``cpp_wrapper``): its
projections and its attention are written as sums (see :func:`functional.linear`), which inductor
streams through the weights at several times the speed of torch's matrix-vector kernels. On a CUDA
(or ROCm) GPU ``mode="reduce-overhead"`` also captures CUDA graphs, for which the cache
storage is kept at one static address per model and shape. The first call for a new shape pays the
compile (up to a minute or so for the small preset's decode step on 2 cores); later calls
with the same shapes, depth and cache budget reuse it. ``compile_seconds`` reports what a call paid.
On the CPU, a decode piece's later calls skip dynamo altogether (:class:`_DirectGraph`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch._inductor.compile_fx import compile_fx

from . import functional as fn
from .kv_cache import KVCache, attention_mask, check_fits

if TYPE_CHECKING:
    from .model import RecurrentLM

# The most recent static cache storage per model (CUDA graphs need inputs at fixed addresses).
_STORAGE: weakref.WeakKeyDictionary[Any, tuple[tuple, torch.Tensor]] = weakref.WeakKeyDictionary()
_COMPILED: dict[str | None, Any] = {}
_SEEN: weakref.WeakKeyDictionary[Any, set] = weakref.WeakKeyDictionary()
_GRAPHS = 0  # graphs compiled in this process (see _expected_recompile)
_CAPTURED: list[tuple[Callable, tuple[str, ...] | None, int]] = []  # set by _recording_inductor
#: The decode piece's tensor arguments, in order (see _decode_piece), and those of them that change
#: from token to token; every other input of its graph is fixed by the CompiledDecode (weights, RoPE
#: table, cache slot views).
_PIECE_ARGS = ("w", "x", "positions", "rope", "state", "slots", "key_valid")
_PER_TOKEN_ARGS = ("x", "positions", "state", "key_valid")
_PER_TOKEN = {f"L['{name}']": i for i, name in enumerate(_PER_TOKEN_ARGS)}
#: A decode piece's two results: None for one its graph computes, else the index in _PER_TOKEN_ARGS of
#: the input it passes through (dynamo returns that input itself; the graph has no output for it)
Outputs = tuple[int | None, int | None]
# Decode graphs callable without dynamo, per model: graph key -> (callable, input sources, outputs)
_DIRECT: weakref.WeakKeyDictionary[Any, dict[tuple, tuple[Callable, tuple[str, ...], Outputs]]] = (
    weakref.WeakKeyDictionary()
)


def compile_mode(device: torch.device | str) -> str | None:
    """torch.compile mode: "reduce-overhead" (CUDA graphs) on a GPU, inductor's default on the CPU."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else None


def static_storage(model: RecurrentLM, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeroed cache storage of ``shape`` for ``model``, reused across calls with the same shape."""
    key = (shape, dtype, model.device)
    held = _STORAGE.get(model)
    if held is not None and held[0] == key:
        return held[1].zero_()
    _STORAGE.pop(model, None)  # free the previous shape's storage before allocating
    check_fits(shape, dtype, model.device, model.config.n_layers_in_recurrent_block)
    storage = torch.zeros(shape, dtype=dtype, device=model.device)
    if storage.is_cuda:
        torch._dynamo.mark_static_address(storage)
    _STORAGE[model] = (key, storage)
    return storage


class _StaticSlot:
    """A :class:`functional.KVCacheSlot` over one whole cache slot (B, 2·heads, max_length, D)."""

    def __init__(
        self, kv: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None
    ) -> None:
        self.kv, self.positions, self.mask = kv, positions, mask

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
            # made it compute them all: ~35% more time)
            T = k.shape[2]
            return self.kv[:, :H, :T], self.kv[:, H:, :T], None
        return self.kv[:, :H], self.kv[:, H:], self.mask


def _block(
    x: torch.Tensor,
    weights: fn.BlockWeights,
    rope: torch.Tensor,
    eps: float,
    kv: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One sandwich block writing its keys/values into slot ``kv`` (B, 2·heads, L, D) at positions."""
    return fn.sandwich_block(x, weights, rope, eps, _StaticSlot(kv, positions, mask))


class DecodeWeights(NamedTuple):
    """Every tensor and constant one decoded token needs, as plain inputs of the compiled graph.

    Tensors rather than the module: dynamo then guards a tuple of tensors instead of walking the
    module tree on every call (that walk cost ~0.3 ms of a ~3 ms token).
    """

    wte: torch.Tensor
    prelude: tuple[fn.BlockWeights, ...]
    adapter: torch.Tensor
    core: tuple[fn.BlockWeights, ...]
    ln_f: torch.Tensor
    coda: tuple[fn.BlockWeights, ...]
    head: torch.Tensor
    emb_scale: float
    eps: float

    @classmethod
    def of(cls, model: RecurrentLM) -> DecodeWeights:
        t = model.transformer
        blocks = lambda layers: tuple(b.weights() for b in layers)  # noqa: E731
        return cls(
            t.wte.weight, blocks(t.prelude), t.adapter.weight, blocks(t.core_block),
            t.ln_f.weight, blocks(t.coda), model.lm_head.weight, model.emb_scale,
            model.config.norm_eps,
        )  # fmt: skip


#: Core iterations one compiled decode graph unrolls at most. Compile time grows faster than the
#: graph (r = 8 in one graph compiles in ~1 min cold, r = 32 took 6.5 min), so a deeper token runs
#: the prelude, chunks of at most this many iterations and the coda as separate graphs: one or two
#: distinct chunk graphs for any depth, at ~0.2 ms of launch per extra graph.
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
    w: DecodeWeights,
    x: torch.Tensor,
    positions: torch.Tensor,
    rope: torch.Tensor,
    state: torch.Tensor,
    slots: tuple[torch.Tensor, ...],
    key_valid: torch.Tensor | None,
    num_steps: int,
    first: bool,
    last: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row through part of the forward; the whole of it when first and last.

    x is the token ids (B, 1) when ``first`` (the prelude runs here), else the prelude's output e.
    Returns (float32 logits (B, 1, V), latents ln_f(s_r)) when ``last``, else (state, e). ``slots``
    holds the cache slot of each of this piece's layer calls in order: views passed one by one, so
    that each write touches its slot only. The per-token host work is in the graph too: the RoPE row
    and the attention mask come from ``positions`` (1,), the whole RoPE table ``rope`` and the
    padding mask ``key_valid`` (B, L) or None. (On the CPU each eager op between two tokens runs
    with caches just flushed by the weights: they cost ~0.3 ms a token in all.)
    """
    calls = iter(slots)
    mask = attention_mask(positions, slots[0].shape[2], key_valid)
    if key_valid is None:
        mask = mask[None, None]
    rope = rope.index_select(0, positions)

    def layers(h: torch.Tensor, blocks: tuple[fn.BlockWeights, ...]) -> torch.Tensor:
        for block in blocks:
            h = _block(h, block, rope, w.eps, next(calls), positions, mask)
        return h

    e = layers(fn.embed(x, w.wte, w.emb_scale), w.prelude) if first else x
    for _ in range(num_steps):
        state = layers(fn.adapter(state, e, w.adapter), w.core)
    if not last:
        return state, e
    latents = fn.rms_norm(state, w.ln_f, w.eps)
    h = layers(latents, w.coda)
    return fn.lm_head(h, w.ln_f, w.head, w.eps), latents


def _prefill_block(*args: Any) -> torch.Tensor:
    """:func:`_block` for prompt chunks (its own compile cache, dynamic in the prompt length)."""
    return _block(*args)


def _expected_recompile() -> Any:
    """Room for one more specialised graph: dynamo's recompile limit (8 per function) counts
    every depth, chunk pattern, shape and model a process compiles, and with fullgraph=True the next
    one would raise. Decode and prefill key their graphs themselves and compile each once, so a call
    that is known to compile lifts the limit past the graphs built so far."""
    global _GRAPHS
    _GRAPHS += 1
    limit = max(torch._dynamo.config.recompile_limit, _GRAPHS)
    return torch._dynamo.config.patch(recompile_limit=limit)


def _source_name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else name


def _recording_inductor(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Inductor with a C++ launcher (as ``options={"cpp_wrapper": True}``) that also records, for
    the graph it just built, its callable, where each input comes from and how many outputs it has."""
    run = compile_fx(gm, example_inputs, config_patches={"cpp_wrapper": True})
    try:
        sources = tuple(
            _source_name(n.meta["grapharg"].source) for n in gm.graph.find_nodes(op="placeholder")
        )
    except (KeyError, AttributeError):  # not dynamo's graph layout: no direct calls
        sources = None
    _CAPTURED[:] = [(run, sources, len(gm.graph.output_node().args[0]))]
    return run


class _DirectGraph:
    """One decode piece's compiled graph called without dynamo's per-call work.

    Every input but the per-token four (``_PER_TOKEN``) is the same object on every token, and those
    four have fixed shapes, so dynamo's guards over the ~60 inputs and its Python wrappers decide
    nothing after the first call; they cost ~0.45 ms of a ~2–2.4 ms token (measured in the generation
    loop, where the weights have just flushed the caches). The graph's C++ launcher still checks every
    input's sizes and strides. A piece that passes an input through (the prelude piece's s_0, a middle
    chunk's e) returns that input as dynamo did.
    """

    def __init__(
        self, run: Callable, sources: tuple[str, ...], outputs: Outputs, args: tuple
    ) -> None:
        scope = {"L": dict(zip(_PIECE_ARGS, args, strict=False))}
        self.run, self.outputs = run, outputs
        self.inputs = [eval(src, {"__builtins__": {}}, scope) for src in sources]  # noqa: S307
        self.per_token = [
            (i, _PER_TOKEN[src]) for i, src in enumerate(sources) if src in _PER_TOKEN
        ]

    def __call__(self, *per_token: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = list(self.inputs)
        for i, which in self.per_token:
            inputs[i] = per_token[which]
        computed = iter(self.run(*inputs))
        first, second = (next(computed) if i is None else per_token[i] for i in self.outputs)
        return first, second


def _direct_graph(model: RecurrentLM, key: tuple, args: tuple, out: tuple) -> _DirectGraph | None:
    """A direct caller of the graph that just ran ``args`` for ``key`` (None where there is none).

    The graph is taken from the compile that ``_CAPTURED`` recorded during that call, or from an earlier
    one for this model. A newly captured graph must output exactly the results that are not per-token
    inputs passed through, and is first rerun on the same inputs to give the same outputs (rewriting
    this token's cache entries with the same values).
    """
    graphs = _DIRECT.setdefault(model, {})
    if _CAPTURED:
        ((run, sources, n_outputs),) = _CAPTURED
        _CAPTURED.clear()
        named = dict(zip(_PIECE_ARGS, args, strict=False))
        per_token = [named[name] for name in _PER_TOKEN_ARGS]
        outputs = tuple(next((i for i, t in enumerate(per_token) if t is o), None) for o in out)
        fixed = ("L['w']", "L['rope']", "L['slots']")  # what stays the same object every token
        if (
            sources is None
            or n_outputs != outputs.count(None)
            or not all(src in _PER_TOKEN or src.startswith(fixed) for src in sources)
        ):
            return None
        direct = _DirectGraph(run, sources, outputs, args)
        again = direct(*per_token)
        if not all(torch.equal(a, b) for a, b in zip(again, out, strict=True)):
            return None
        graphs[key] = (run, sources, outputs)
        return direct
    if key not in graphs:
        return None
    return _DirectGraph(*graphs[key], args)


def _compiled(which: str, mode: str | None) -> Any:
    key = f"{which}-{mode}"
    if key not in _COMPILED:
        target, dynamic = (_decode_piece, False) if which == "decode" else (_prefill_block, None)
        # On the CPU the graph's launcher is generated C++ too (cpp_wrapper): a decode token is ~100
        # kernels, and the Python launcher alone cost ~1 ms of a ~7 ms token.
        # The decode graph's inductor records what a direct call needs (see _DirectGraph).
        if which == "decode" and mode is None:
            compiled = torch.compile(
                target, backend=_recording_inductor, dynamic=dynamic, fullgraph=True
            )
        else:
            options = {"cpp_wrapper": True} if mode is None else None
            compiled = torch.compile(
                target, mode=mode, dynamic=dynamic, fullgraph=True, options=options
            )
        _COMPILED[key] = compiled
    return _COMPILED[key]


class CompiledDecode:
    """Fixed-depth chunks of ``model`` over ``cache``: compiled decode token, per-layer prefill."""

    def __init__(
        self, model: RecurrentLM, cache: KVCache, num_steps: int, mode: str | None = None
    ) -> None:
        if num_steps > cache.max_steps:
            raise ValueError(f"num_steps {num_steps} exceeds the cache's {cache.max_steps} steps")
        self.model, self.cache, self.num_steps, self.mode = model, cache, num_steps, mode
        t = model.transformer
        slots = cache.kv_slots
        n_coda = len(t.coda)
        prelude = [cache.physical(i) for i in range(len(t.prelude))]
        core = [[cache.core_slot(step, j) for j in range(cache.n_core)]
                for step in range(1, num_steps + 1)]  # fmt: skip
        coda = [cache.physical(k - n_coda) for k in range(n_coda)]
        self.prelude = [(b.weights(), slots[i]) for b, i in zip(t.prelude, prelude, strict=True)]
        self.core = [
            [(b.weights(), slots[i]) for b, i in zip(t.core_block, step, strict=True)]
            for step in core
        ]
        self.coda = [(b.weights(), slots[i]) for b, i in zip(t.coda, coda, strict=True)]
        self.pieces = self._plan(slots, prelude, core, coda)
        self.weights = DecodeWeights.of(model)
        # what a decode token reads besides its ids: the whole RoPE table (the graph picks its row)
        # and one position tensor per cache position, built once instead of per token
        self.rope = torch.view_as_real(model.rope_at(0, cache.max_length))
        self.positions = torch.arange(cache.max_length, device=model.device).split(1)
        self.seen = _SEEN.setdefault(model, set())  # graphs already compiled for this model
        self.shape_key = (cache.kv.shape[1], cache.max_length, model.dtype, mode)
        self.zero_state: torch.Tensor | None = None
        self.direct: dict[int, _DirectGraph | None] = {}  # per piece, once looked up
        self.compile_seconds = 0.0

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
        m, c = self.model, self.cache
        B, T = ids.shape
        c.begin(start, T)  # checks that the positions fit
        if self.mode == "reduce-overhead":  # a new CUDA-graph tree step: earlier outputs are done
            torch.compiler.cudagraph_mark_step_begin()
        if T == 1:
            return self._token(ids, start, state)
        if state is None:
            state = torch.zeros(B, T, m.config.n_embd, device=ids.device, dtype=m.dtype)
        return self._prefill(ids, start, state)

    def _token(
        self, ids: torch.Tensor, start: int, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode token: the graphs of ``pieces`` in turn, with as little host work as possible."""
        x = ids.reshape(-1).clone().view(ids.shape)  # the same strides and mode for every token
        if state is None:  # s_0 = 0: one zero tensor, made in the caller's mode, serves every token
            if self.zero_state is None:
                self.zero_state = torch.zeros(*ids.shape, self.model.config.n_embd,
                                              device=ids.device, dtype=self.model.dtype)  # fmt: skip
            state = self.zero_state
        decode, positions = _compiled("decode", self.mode), self.positions[start]
        key_valid = self.cache.key_valid
        for i, piece in enumerate(self.pieces):
            direct = self.direct.get(i)
            if direct is not None and state.dtype == self.model.dtype:
                state, x = direct(x, positions, state, key_valid)
                continue
            key = (*self.shape_key, key_valid is None, *piece.key)
            args = (self.weights, x, positions, self.rope, state, piece.slots, key_valid,
                    piece.num_steps, piece.first, piece.last)  # fmt: skip
            _CAPTURED.clear()
            if key in self.seen:
                out = decode(*args)
            else:
                # the first call for this graph and slot pattern compiles it
                t0 = time.perf_counter()
                with _expected_recompile():
                    out = decode(*args)
                self.seen.add(key)
                self.compile_seconds += time.perf_counter() - t0
            if i not in self.direct and self.mode is None:
                self.direct[i] = _direct_graph(self.model, key, args, out)
            state, x = out
        return state, x  # the last piece returns (logits, latents)

    def _prefill(
        self, ids: torch.Tensor, start: int, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A prompt chunk: one compiled sandwich block per layer call."""
        m, c = self.model, self.cache
        t, eps = m.transformer, m.config.norm_eps
        B, T = ids.shape
        rope = torch.view_as_real(m.rope_at(start, T))  # (T, head_dim / 2, 2): cos, sin
        positions = torch.arange(start, start + T, device=ids.device)
        mask: torch.Tensor | None = None  # from position 0 unpadded: causal, no mask to read
        if c.key_valid is not None or start > 0:
            mask = attention_mask(positions, c.max_length, c.key_valid)
            if c.key_valid is None:
                mask = mask[None, None]
        shape_key = (*self.shape_key, c.key_valid is None, T)
        t0 = time.perf_counter()
        block = _compiled("prefill", self.mode)

        def layers(x: torch.Tensor, blocks: list) -> torch.Tensor:
            for weights, kv in blocks:
                x = block(x, weights, rope, eps, kv, positions, mask)
            return x

        x = fn.embed(ids, t.wte.weight, m.emb_scale)
        if shape_key in self.seen:
            e = layers(x, self.prelude)
        else:  # the first compiled call builds the graph
            with _expected_recompile():
                e = layers(x, self.prelude)
            self.seen.add(shape_key)
            self.compile_seconds += time.perf_counter() - t0
        for step_blocks in self.core:
            state = layers(fn.adapter(state, e, t.adapter.weight), step_blocks)
        latents = fn.rms_norm(state, t.ln_f.weight, eps)
        x = layers(latents, self.coda)[:, -1:]
        return fn.lm_head(x, t.ln_f.weight, m.lm_head.weight, eps), latents
