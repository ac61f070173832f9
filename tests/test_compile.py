"""compile_blocks: the compiled model computes the same function, and hooks still fire."""

from __future__ import annotations

import pytest
import torch

import recurrent_model as rm
from recurrent_model import compiled as C
from recurrent_model import hook_names
from recurrent_model import inductor_raw_entry as raw_entry


def tiny_ids(
    model: rm.RecurrentLM, shape: tuple[int, int], seed: int, low: int = 0
) -> torch.Tensor:
    """Token ids of ``shape`` from ``model``'s vocabulary, drawn from their own seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, model.config.vocab_size, shape, generator=g)


def test_importing_recurrent_model_loads_no_compiler():
    import subprocess
    import sys

    code = "import sys, recurrent_model; recurrent_model.RecurrentLM; recurrent_model.load_model; print(sorted(m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_compiled_blocks_match_eager_and_keep_hooks():
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    with torch.no_grad():
        model.transformer.core_block[0].attn.qk_bias.normal_(0, 0.3)  # exercise bias + RoPE
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        eager = model(ids, num_steps=3, init_scale=0.0).logits
        model.compile_blocks(dynamic=False)
        compiled = model(ids, num_steps=3, init_scale=0.0).logits
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
        steps = []
        zero = lambda x, hook: steps.append(hook.step) or torch.zeros_like(x)  # noqa: E731
        with model.hooks([(hook_names.core(1, "hook_mlp_out"), zero)]):
            ablated = model(ids, num_steps=3, init_scale=0.0).logits
    assert steps == [1, 2, 3]
    assert not torch.allclose(ablated, eager, atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("batch, steps, budget", [(1, 2, None), (2, 2, None), (1, 6, 4)])
def test_compiled_decode_gives_the_eager_tokens(batch, steps, budget, monkeypatch):
    # A one-token prompt needs no prefill, so only the decode step compiles (one small graph).
    # Batch 1 takes the CPU's sum-written projections and attention, batch 2 torch's kernels;
    # with at most 3 iterations unrolled, 6 run as prelude, two chunks of 3 and coda (separate
    # graphs), here over a budgeted cache whose core slots repeat within a chunk.

    monkeypatch.setattr(C, "MAX_UNROLLED_STEPS", 3)
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    with torch.no_grad():
        model.transformer.core_block[0].attn.qk_bias.normal_(0, 0.3)
    ids = tiny_ids(model, (batch, 1), seed=1)
    kw = dict(
        num_steps=steps,
        stop_tokens=(),
        return_details=True,
        output_scores=True,
        cache_budget=budget,
    )
    eager = model.generate(ids, 5, generator=torch.Generator().manual_seed(2), **kw)
    compiled = model.generate(
        ids, 5, generator=torch.Generator().manual_seed(2), compile=True, **kw
    )
    assert not eager.compiled and compiled.compiled and compiled.compile_seconds > 0
    assert torch.equal(compiled.sequences, eager.sequences)
    torch.testing.assert_close(compiled.scores, eager.scores, rtol=1e-4, atol=1e-4)
    again = model.generate(ids, 5, generator=torch.Generator().manual_seed(2), compile=True, **kw)
    assert again.compile_seconds == 0.0 and torch.equal(again.sequences, eager.sequences)


@pytest.mark.slow
def test_compiled_prefill_gives_the_eager_tokens_for_any_prompt_length():
    # Two prompt lengths: the second call recompiles the prefill block with a symbolic length.
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    kw = dict(num_steps=2, stop_tokens=(), init_scale=0.0)
    for length in (6, 11):
        ids = torch.randint(
            0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length)
        )
        eager = model.generate(ids, 3, **kw)
        compiled = model.generate(ids, 3, compile=True, **kw)
        assert torch.equal(compiled, eager)


def test_one_row_projection_and_attention_compile_to_the_same_function():
    # Batch-1 decoding on the CPU writes x @ Wᵀ and attention as sums inside compiled graphs only.
    import torch.nn.functional as F

    from recurrent_model import functional as fn

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 1, 48, generator=g), torch.randn(80, 48, generator=g)
    q, k, v = (torch.randn(1, 3, n, 16, generator=g) for n in (1, 9, 9))
    mask = torch.rand(1, 1, 1, 9, generator=g) > 0.3
    mask[..., 0] = True
    assert torch.equal(fn.linear(x, w), F.linear(x, w))  # eager: exactly F.linear
    compiled = torch.compile(lambda *a: (fn.linear(a[0], a[1]), fn.attend(*a[2:], causal=False)))
    y, att = compiled(x, w, q, k, v, mask)
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(att, ref, rtol=1e-5, atol=1e-5)


def test_one_row_projection_groups_rows_without_changing_any_sum(monkeypatch):
    # The rows of a compiled one-row projection are reduced in fn.ROW_GROUPS groups side by side;
    # each row's own sum keeps its order, so the output is bit-identical to one group, in row order
    # (a weight whose rows do not split evenly stays one group).
    from recurrent_model import functional as fn

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 48, generator=g)
    for rows in (80, 78):
        w = torch.randn(rows, 48, generator=g)
        monkeypatch.setattr(fn, "ROW_GROUPS", 4)
        grouped = torch.compile(fn.linear, fullgraph=True)(x, w)
        monkeypatch.setattr(fn, "ROW_GROUPS", 1)
        single = torch.compile(fn.linear, fullgraph=True)(x, w)
        assert grouped.shape == (1, 1, rows)
        assert torch.equal(grouped, single)
        torch.testing.assert_close(grouped, x @ w.T, rtol=1e-5, atol=1e-5)


def test_one_row_attention_groups_values_without_changing_any_sum(monkeypatch):
    # The weighted sum of values of a compiled one-row attention runs in fn.ROW_GROUPS groups of
    # head_dim side by side; each output's sum over the keys keeps its order, so the output is
    # bit-identical to one group (a head_dim that does not split evenly stays one group).
    from recurrent_model import functional as fn

    g = torch.Generator().manual_seed(0)
    for head_dim, dtype in ((64, torch.float32), (18, torch.float32), (64, torch.bfloat16)):
        q, k, v = (torch.randn(1, 2, n, head_dim, generator=g).to(dtype) for n in (1, 40, 40))
        mask = torch.rand(1, 1, 1, 40, generator=g) > 0.3
        mask[..., 0] = True
        outs = {}
        for groups in (4, 1):
            monkeypatch.setattr(fn, "ROW_GROUPS", groups)
            torch._dynamo.reset()
            outs[groups] = torch.compile(fn.attend, fullgraph=True)(q, k, v, mask, False)
        assert outs[4].shape == (1, 2, 1, head_dim) and outs[4].dtype == dtype
        assert torch.equal(outs[4], outs[1])
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(outs[4], ref, rtol=tol, atol=tol)


def test_long_and_bf16_rows_compile_to_products_without_the_cascade_helper():
    # Inductor sums a reduction longer than fn.CASCADE_LENGTH through a slow pairwise helper; a
    # compiled one-row product with longer rows sums equal parts of whole vectors (float32 partial
    # sums) and emits no such helper. bf16 rows of even length are widened as 32-bit pairs (even
    # and odd elements apart), odd ones by plain conversion: the same products either way.
    from torch._inductor.utils import run_and_get_code

    from recurrent_model import functional as fn

    assert [fn._row_parts(n) for n in (256, 4096, 5280, 10560, 17920, 4097)] == [1, 1, 2, 3, 5, 1]
    for n in (5280, 10560, 17920, 8192, 4112):
        parts = fn._row_parts(n)
        assert n % (16 * parts) == 0 and n // parts <= fn.CASCADE_LENGTH
    g = torch.Generator().manual_seed(0)
    for dtype, n, tol in ((torch.float32, 5280, 1e-4), (torch.bfloat16, 17920, 2e-2),
                          (torch.bfloat16, 97, 1e-2)):  # fmt: skip
        x = torch.randn(1, 1, n, generator=g).to(dtype)
        w = (torch.randn(24, n, generator=g) * 0.05).to(dtype)
        torch._dynamo.reset()
        y, code = run_and_get_code(torch.compile(fn.linear, fullgraph=True), x, w)
        assert y.dtype == dtype and y.shape == (1, 1, 24)
        assert "cascade_sum" not in "".join(code)
        assert ("int32_t" in "".join(code)) == (dtype == torch.bfloat16 and n % 2 == 0)
        exact = x.double() @ w.double().T
        torch.testing.assert_close(y.double(), exact, rtol=tol, atol=tol)


def test_deep_decode_tokens_run_as_a_few_graphs_of_bounded_depth():
    from recurrent_model.compiled import MAX_UNROLLED_STEPS, CompiledDecode
    from recurrent_model.kv_cache import KVCache

    cfg = rm.preset("tiny")
    model = rm.RecurrentLM(cfg).eval()
    for steps, chunks in [(8, None), (10, [5, 5]), (20, [7, 7, 6]), (32, [8, 8, 8, 8])]:
        cache = KVCache(cfg, 1, 16, steps)
        # the plan alone: no product timing, so no token check compiles the tokens
        pieces = CompiledDecode(model, cache, steps, matvec=()).pieces
        if chunks is None:  # shallow enough: the whole token is one graph
            assert [(p.num_steps, p.first, p.last) for p in pieces] == [(steps, True, True)]
            continue
        assert max(chunks) <= MAX_UNROLLED_STEPS
        assert [(p.num_steps, p.first, p.last) for p in pieces] == [
            (0, True, False),
            *((n, False, False) for n in chunks),
            (0, False, True),
        ]
        # every layer call's cache slot exactly once, in forward order
        order = [i for p in pieces for i in p.slot_indices]
        assert order == sorted(order) == list(range(len(cache.kv_slots)))


@pytest.mark.slow
def test_a_depth_sweep_compiles_past_dynamo_recompile_limit():
    # Every depth is its own decode graph; dynamo's per-function limit (8, here lowered to 1) must
    # not stop a sweep, which with fullgraph=True would raise on the first graph past it.
    # (config.patch, not monkeypatch: pytest would delete the config attribute on undo.)
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    ids = tiny_ids(model, (1, 1), seed=3)
    before = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=1):
        for steps in (2, 3):  # depths other tests compile too: inductor's cache serves them
            kw = dict(num_steps=steps, stop_tokens=(), init_scale=0.0)
            eager = model.generate(ids, 2, **kw)
            assert torch.equal(model.generate(ids, 2, compile=True, **kw), eager)
    assert torch._dynamo.config.recompile_limit == before  # the decode's own lifts are undone


@pytest.mark.slow
def test_compiled_decode_of_a_left_padded_batch_gives_the_eager_tokens():
    # The decode graph builds the attention mask itself from the position and the pad mask.
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=g)
    ids[1, :3] = 7
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    kw = dict(num_steps=2, stop_tokens=(), init_scale=0.0, attention_mask=mask)
    kw.update(output_scores=True, return_details=True)
    eager = model.generate(ids, 4, **kw)
    compiled = model.generate(ids, 4, compile=True, **kw)
    assert torch.equal(compiled.sequences, eager.sequences)
    torch.testing.assert_close(compiled.scores, eager.scores, rtol=1e-4, atol=1e-4)
    # Continuous compute starts each token from the last latent: the first a strided view of the
    # prefill's latents, the next the token graph's own output.
    kw.update(continuous_compute=True)
    eager = model.generate(ids, 4, **kw)
    compiled = model.generate(ids, 4, compile=True, **kw)
    assert torch.equal(compiled.sequences, eager.sequences)
    torch.testing.assert_close(compiled.scores, eager.scores, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_decode_pieces_are_called_directly_once_their_graph_checked_out():
    # After a piece's first call its graph runs without dynamo (CompiledDecode fixes every input but
    # the per-token four). A piece whose graph passes an input through (the prelude piece's s_0, a
    # middle chunk's e) has one graph output, and the direct call returns that input itself.
    from recurrent_model.compiled import CompiledDecode, _DirectGraph
    from recurrent_model.kv_cache import KVCache

    torch.manual_seed(0)
    cfg = rm.preset("tiny")
    model = rm.RecurrentLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    # the depths and cache budgets of other tests' graphs (the depth sweep's 3, the chunked budgeted
    # decode's 10 over 4 slots), so that inductor's cache serves them
    for steps, n_pieces, budget in [(3, 1, None), (10, 4, 4)]:
        kw = dict(num_steps=steps, stop_tokens=(), init_scale=0.0, cache_budget=budget)
        assert torch.equal(model.generate(ids, 4, compile=True, **kw), model.generate(ids, 4, **kw))
        # generate's static cache length (9 tokens rounded up to 64): the graphs it just compiled
        dec = CompiledDecode(model, KVCache(cfg, 1, 64, steps, budget), steps)
        with torch.inference_mode():
            dec(ids, 0, None)
            for pos in (5, 6):  # the second token takes the direct calls
                logits, _ = dec(ids[:, :1], pos, None)
        assert all(isinstance(dec.direct[i], _DirectGraph) for i in range(n_pieces))
        assert len(dec.direct) == n_pieces
        # in inference mode below torch.compile's Python wrappers too, and through each launcher's
        # raw entry where this torch's launchers get one (pieces that pass an input through too)
        assert all(dec.direct[i].boxed is not None for i in range(n_pieces))
        assert all(
            (dec.direct[i].raw is not None) == raw_entry.supported() for i in range(n_pieces)
        )
        # each key count a tensor made once (the launcher's torch.tensor of it otherwise)
        sizes = dec.direct[0].size_tensors
        assert sizes and all(t.dtype == torch.int64 and t.item() == n for n, t in sizes.items())
        token = (ids[:, :1], dec.positions[6], dec.zero_state, dec.cache.key_valid, dec.keys[6])
        again = dec.direct[0].boxed_inputs(token)
        assert any(a is t for a in again for t in sizes.values())
        outputs = [dec.direct[i].outputs for i in range(n_pieces)]
        passes = {1: [(None,) * 3], 4: [(2, None), (None, 0), (None, 0), (None,) * 3]}
        assert outputs == passes[n_pieces]  # s_0 passed by the prelude piece, e by the chunks
        assert logits.shape == (1, 1, cfg.vocab_size)
        with torch.inference_mode():  # the last piece's greedy tokens, fed back as the next ids
            token = dec.token(ids[:, :1], 7, None)
            assert torch.equal(token.greedy, token.logits[:, -1].argmax(-1))
            after = dec.token(token.greedy[:, None], 8, None)
            assert torch.equal(after.greedy, after.logits[:, -1].argmax(-1))


@pytest.mark.slow
@pytest.mark.skipif(not (raw_entry.supported() and C.direct_calls_supported()),
                    reason="checked torch releases only")  # fmt: skip
def test_generate_reuses_two_sets_of_token_results_in_turn(monkeypatch):
    # From the second token on the compiled token writes its results into one of two sets of
    # buffers, in turn: each token reads the previous one's set (its ids and, with continuous
    # compute, its latents) while writing the other. The graph is the depth-3 one of the tests
    # above.
    torch.manual_seed(0)
    cfg = rm.preset("tiny")
    model = rm.RecurrentLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    kw = dict(num_steps=3, stop_tokens=(), init_scale=0.0, continuous_compute=True,
              output_scores=True, return_details=True)  # fmt: skip
    eager = model.generate(ids, 6, **kw)
    model.generate(ids, 6, compile=True, **kw)  # compiles and chooses the products: tokens too
    token, calls = C.CompiledDecode.token, []

    def spied(self, ids, start, state, into=None):
        out = token(self, ids, start, state, into)
        calls.append((ids, state, into, out))
        return out

    monkeypatch.setattr(C.CompiledDecode, "token", spied)
    compiled = model.generate(ids, 6, compile=True, **kw)
    assert torch.equal(compiled.sequences, eager.sequences)
    torch.testing.assert_close(compiled.scores, eager.scores, rtol=1e-4, atol=1e-4)
    intos = [into for _, _, into, _ in calls]
    a, b = intos[1], intos[2]
    assert intos == [None, a, b, a, b, a] and a is not None and b is not None and a is not b
    for (_, _, into, out), (ids, state, _, _) in zip(calls[1:], calls[2:]):
        assert all(x is y for x, y in zip(out, into.tensors, strict=True))
        assert ids.data_ptr() == out.greedy.data_ptr() and ids.stride() == (1, 1)
        assert state is out.latents


@pytest.mark.slow
def test_compiled_sampling_draws_from_the_logits_not_the_graphs_greedy_tokens():
    # One generator draws s_0 and the tokens in the same order on both paths, so the compiled
    # decode samples the eager tokens; the greedy tokens the graph also returns are not used.
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    ids = tiny_ids(model, (2, 1), seed=1)
    kw = dict(num_steps=2, stop_tokens=(), temperature=2.0, return_details=True)

    def run(**options):
        return model.generate(ids, 5, generator=torch.Generator().manual_seed(3), **kw, **options)

    eager, compiled = run(do_sample=True), run(do_sample=True, compile=True)
    assert compiled.compiled and torch.equal(compiled.sequences, eager.sequences)
    assert not torch.equal(compiled.sequences, run(compile=True).sequences)


@pytest.mark.slow
def test_the_graphs_greedy_tokens_break_ties_as_torchs_argmax():
    # With the head's weights zero every logit is 0: torch's argmax takes the first index, and so
    # must the graph's, or a greedy decode would emit other tokens than the eager one.
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    ids = tiny_ids(model, (2, 1), seed=1, low=1)
    kw = dict(num_steps=2, stop_tokens=(), init_scale=0.0, return_details=True, output_scores=True)
    eager, compiled = model.generate(ids, 3, **kw), model.generate(ids, 3, compile=True, **kw)
    assert compiled.compiled and bool((compiled.scores == 0).all())
    assert torch.equal(compiled.sequences, eager.sequences)
    assert bool((compiled.sequences[:, 1:] == 0).all())


def test_a_captured_graph_that_does_not_reproduce_its_call_is_not_called_directly():
    from recurrent_model.compiled import CompileState, _Captured

    state = CompileState()
    x, s0 = torch.ones(1, 1), torch.zeros(1, 1, 4)
    args = (None, x, None, None, s0, None, None, None, 1, True, True)
    sources = ("L['state']", "L['x']")
    plus_one = _Captured(lambda s, x: (x + 1,), sources, 1)  # s is passed through
    assert state.direct_graph(("bad",), plus_one, args, (x + 2, s0)) is None
    assert ("bad",) not in state.direct
    unknown = _Captured(lambda s, x: (x + 1,), ("L['state']", "L['other']"), 1)
    assert state.direct_graph(("odd",), unknown, args, (x + 1, s0)) is None  # not known fixed
    miscounted = _Captured(
        lambda s, x: (x + 1, s), sources, 2
    )  # outputs ≠ results less pass-throughs
    assert state.direct_graph(("miscounted",), miscounted, args, (x + 1, s0)) is None
    direct = state.direct_graph(("good",), plus_one, args, (x + 1, s0))
    assert state.direct[("good",)].sources == sources
    y, s = direct(torch.full((1, 1), 5.0), None, s0 + 3, None, None)  # per-token inputs replaced
    assert torch.equal(y, torch.full((1, 1), 6.0)) and torch.equal(s, s0 + 3)
    again = state.direct_graph(("good",), None, args, (x + 1, s0))  # found again without a capture
    assert isinstance(again, type(direct)) and again.inputs == direct.inputs


def test_a_fixed_input_laid_out_otherwise_is_left_to_dynamos_guards():
    # The launcher does not check its inputs' sizes and strides: a direct caller is only made
    # for fixed inputs laid out as at the graph's first call.
    from recurrent_model.compiled import CompileState, _Captured

    state, x, s0 = CompileState(), torch.ones(1, 1), torch.zeros(1, 1, 4)

    def args(w: torch.Tensor) -> tuple:
        return (w, x, None, None, s0, None, None, None, 1, True, True)

    plus_w = _Captured(lambda w, x: (x + w.sum(),), ("L['w']", "L['x']"), 1)
    assert state.direct_graph(("k",), plus_w, args(torch.ones(3)), (x + 3, s0)) is not None
    same = state.direct_graph(("k",), None, args(torch.full((3,), 2.0)), ())
    y, _ = same(x, None, s0, None, None)
    assert torch.equal(y, x + 6)
    for w in (torch.ones(4), torch.ones(6)[::2], torch.ones(3, dtype=torch.float64)):
        assert state.direct_graph(("k",), None, args(w), ()) is None


def test_a_decode_token_refuses_ids_and_states_of_another_shape():
    from recurrent_model.compiled import CompiledDecode

    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    decode = CompiledDecode(model, rm.KVCache(model.config, 1, 64, 2), 2, matvec=())
    h = model.config.n_embd
    with pytest.raises(ValueError, match=r"takes \(1, 1\) int64 ids, got \(2, 1\)"):
        decode(torch.zeros(2, 1, dtype=torch.long), 0, None)
    with pytest.raises(ValueError, match="int64 ids, got .* torch.int32"):
        decode(torch.zeros(1, 1, dtype=torch.int32), 0, None)
    with pytest.raises(ValueError, match=r"s_0 of shape \(1, 1, 3\) for ids of \(1, 1\)"):
        decode(torch.zeros(1, 1, dtype=torch.long), 0, torch.zeros(1, 1, 3))
    assert h != 3


def test_a_size_source_passes_the_per_token_key_count():
    from recurrent_model.compiled import CompileState, _Captured, per_token_source

    assert per_token_source("L['keys'].size()[0]") == (4, 0)
    assert per_token_source("L['x']") == (0, None)
    assert per_token_source("L['w'].size()[0]") is None and per_token_source("L['keys'][0]") is None
    state, x, s0 = CompileState(), torch.ones(1, 1), torch.zeros(1, 1, 4)
    keys = torch.arange(32)
    args = (None, x, None, None, s0, None, None, keys[:16], 1, True, True)
    times_count = _Captured(lambda n, x: (x * n,), ("L['keys'].size()[0]", "L['x']"), 1)
    direct = state.direct_graph(("n",), times_count, args, (x * 16, s0))
    y, _ = direct(x, None, s0, None, keys[:24])
    assert torch.equal(y, x * 24)


def test_key_ranges_cover_each_position_in_blocks_and_keep_the_whole_length_static():
    from recurrent_model.compiled import KEY_BLOCK, _key_ranges

    views = _key_ranges(40, torch.device("cpu"), dynamic=True)
    lengths = [len(v) for v in views]
    assert lengths == [16] * 16 + [32] * 16 + [40] * 8
    assert all(p < n for p, n in enumerate(lengths)) and KEY_BLOCK == 16
    marked = [hasattr(v, "_dynamo_dynamic_indices") for v in views]
    assert marked == [True] * 32 + [False] * 8  # the whole length is left static
    assert all(len(v) == 40 for v in _key_ranges(40, torch.device("cpu"), dynamic=False))


@pytest.mark.slow
def test_one_decode_graph_serves_every_key_count_from_a_full_first_token_on(monkeypatch):
    # A decode whose first compiled token reads the whole cache (prompt 60 of 64) must not fix the
    # key count: a later call starting early in the cache and running to its end reuses the graph.

    built = []
    record = C._RecordingInductor.__call__

    def counted(self, gm, example_inputs):
        built.append(len(example_inputs))
        return record(self, gm, example_inputs)

    monkeypatch.setattr(C._RecordingInductor, "__call__", counted)
    # the per-shape product timing may pick torch's product under load, and its whole-token check
    # builds graphs of its own: this test counts the decode's graphs, so every product is sum-written
    monkeypatch.setattr(C.CompileState, "matvec_shapes", lambda self, config, dtype: ())
    torch.manual_seed(0)
    cfg = rm.preset("tiny")
    model = rm.RecurrentLM(cfg).eval()
    g = torch.Generator().manual_seed(2)
    kw = dict(num_steps=3, stop_tokens=(), init_scale=0.0)
    for prompt, new in [(60, 4), (5, 59), (30, 20)]:  # all in one 64-position cache
        ids = torch.randint(0, cfg.vocab_size, (1, prompt), generator=g)
        compiled = model.generate(ids, new, compile=True, **kw)
        assert torch.equal(compiled, model.generate(ids, new, **kw))
    assert len(built) == 1


def test_graph_input_sources_resolve_to_the_piece_arguments():
    from recurrent_model.compiled import resolve_source
    from recurrent_model.stack import LayerStack

    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    w = LayerStack.of(model)
    slots = (torch.zeros(2), torch.ones(3))
    args = {"w": w, "slots": slots}
    assert resolve_source("L['w'][3][1][2]", args) is w.core[1].qk_bias
    assert resolve_source("L['w'].core[1].wqkv", args) is w.core[1].wqkv
    assert resolve_source("L['slots'][1]", args) is slots[1]
    for bad in ("L['nothing']", "G['w']", "L['w'][0](1)", "L['w'].__class__()"):
        with pytest.raises(KeyError):
            resolve_source(bad, args)


def test_direct_calls_fall_back_with_one_note_on_an_unchecked_torch(monkeypatch):

    monkeypatch.setattr(C, "DIRECT_CALL_TORCH", ((1, 0),))
    state = C.CompileState()
    with pytest.warns(RuntimeWarning, match="plain torch.compile|torch.compile's guards"):
        assert state.function("decode", ("k",), None).recorder is None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the note is given once per model
        assert state.function("decode", ("k2",), None).recorder is None
    monkeypatch.setattr(C, "DIRECT_CALL_TORCH", (C.torch_release(),))
    assert C.CompileState().function("decode", ("k",), None).recorder is not None


def test_compile_state_is_per_model():
    from recurrent_model.compiled import compile_state

    a, b = (rm.RecurrentLM(rm.preset("tiny")).eval() for _ in range(2))
    assert compile_state(a) is compile_state(a) and compile_state(a) is not compile_state(b)
    shape = rm.KVCache.shape_for(a.config, 1, 8, 2)
    storage = compile_state(a).static_storage(shape, torch.float32, a.device, 2)
    storage.fill_(1.0)
    assert compile_state(a).static_storage(shape, torch.float32, a.device, 2) is storage
    assert not storage.any()  # handed out zeroed
    assert compile_state(b).storage is None


def test_each_projection_shape_is_measured_once_and_the_faster_product_kept(monkeypatch):

    calls = []

    def fake_timing(shape, dtype, functions):  # torch's product faster for the square shapes only
        calls.append(shape)
        square = shape[0] == shape[1]
        return C.ProductTiming(({"sum": 2.0 if square else 1.0, "matvec": 1.0 if square else 2.0},))

    monkeypatch.setattr(C, "time_products", fake_timing)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    state, cfg = C.CompileState(), model.config
    h = cfg.n_embd
    assert state.matvec_shapes(cfg, model.dtype) == ((h, h),)  # the attention output projection
    shapes = {(3 * h, h), (h, h), (2 * model.config.intermediate_size, h), (h, 128), (h, 2 * h),
              (model.config.vocab_size, h)}  # fmt: skip
    assert sorted(calls) == sorted(shapes)
    assert state.matvec_shapes(cfg, model.dtype) == ((h, h),)  # cached per shape
    assert len(calls) == len(shapes)


def _square_matvec(monkeypatch):
    """Product timings in which torch's product is faster for the square (attention output)
    weights only."""

    def fake_timing(shape, dtype, functions):
        square = shape[0] == shape[1]
        return C.ProductTiming(({"sum": 2.0 if square else 1.0, "matvec": 1.0 if square else 2.0},))

    monkeypatch.setattr(C, "time_products", fake_timing)


@pytest.mark.parametrize("faster", ["sum", "matvec"])
def test_products_faster_alone_are_kept_only_when_the_whole_token_is_faster(monkeypatch, faster):
    # Torch's product leaves the token's fused kernel, so a shape where it is faster alone goes to
    # a check on whole tokens; the decision is made once per token graph.

    _square_matvec(monkeypatch)
    calls = []

    def fake_tokens(decodes, rounds, tokens):
        calls.append({name: d.weights.matvec for name, d in decodes.items()})
        fast, slow = {"sum": 1.0, "matvec": 2.0}, {"sum": 2.0, "matvec": 1.0}
        return C.ProductTiming(((fast if faster == "sum" else slow),) * rounds)

    monkeypatch.setattr(C, "time_tokens", fake_tokens)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    h = model.config.n_embd
    cache = rm.KVCache(model.config, 1, 64, 2)
    decode = C.CompiledDecode(model, cache, 2)
    assert calls == [{"matvec": ((h, h),), "sum": ()}]
    assert decode.weights.matvec == (((h, h),) if faster == "matvec" else ())
    check = next(iter(C.compile_state(model).token_checks.values()))
    assert check.shapes == ((h, h),) and check.choice.product == faster
    assert C.CompiledDecode(model, cache, 2).weights.matvec == decode.weights.matvec
    assert len(calls) == 1  # checked once
    assert C.CompiledDecode(model, rm.KVCache(model.config, 2, 64, 2), 2).weights.matvec == ()
    assert len(calls) == 1  # batch 2 takes torch's kernels without a check


@pytest.mark.slow
def test_the_token_check_runs_both_tokens_and_leaves_the_cache_as_it_was(monkeypatch):

    _square_matvec(monkeypatch)
    monkeypatch.setattr(C, "TOKEN_CHECK_ROUNDS", 1)
    monkeypatch.setattr(C, "TOKEN_CHECK_TOKENS", 2)
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval()
    cache = rm.KVCache(model.config, 1, 64, 2)
    cache.kv.normal_()
    cache.begin(5, 3)
    before = cache.kv.clone(), cache.start, cache.end, cache.mask
    decode = C.CompiledDecode(model, cache, 2)
    assert torch.equal(cache.kv, before[0]) and (cache.start, cache.end) == before[1:3]
    assert cache.mask is before[3]
    (check,) = C.compile_state(model).token_checks.values()
    assert set(check.timing.rounds[0]) == {"sum", "matvec"}
    assert check.choice == C.choose_product(check.timing)
    assert decode.compile_seconds > 0  # both tokens compiled in the check
    ids = tiny_ids(model, (1, 4), seed=1)
    kw = dict(num_steps=2, stop_tokens=(), init_scale=0.0)
    eager = model.generate(ids, 4, **kw)
    assert torch.equal(model.generate(ids, 4, compile=True, **kw), eager)
    assert len(C.compile_state(model).token_checks) == 1  # generate's decode reused the decision


def test_product_timing_compiles_past_a_low_recompile_limit(monkeypatch):
    # Each shape's timing graph lives on a code object of its own and is traced once, from inside
    # inference mode or not, so a low dynamo limit (the depth sweep above, a process that times
    # many models) does not stop the measurement.

    monkeypatch.setattr(C, "PRODUCT_COPIES", 2)
    monkeypatch.setattr(C, "PRODUCT_REPEATS", 1)
    functions: C.TimingFunctions = {}
    with torch._dynamo.config.patch(recompile_limit=1):
        for shape in ((80, 48), (78, 48)):  # four row groups, then one
            best = C.time_products(shape, torch.float32, functions).best
            assert set(best) == {"sum", "matvec"} and all(t > 0 for t in best.values())
        with torch.inference_mode():  # as generate calls it: the same graph
            assert C.time_products((80, 48), torch.float32, functions).best["sum"] > 0
        assert torch._dynamo.config.recompile_limit == 1
        assert len(functions) == 4  # two products of two shapes, each built once
        C.time_products((80, 48), torch.float32, {})  # another state's graph of the same shape


def test_a_matvec_within_the_measurement_margin_leaves_the_sum_written_product(monkeypatch):

    def close(shape, dtype, functions):  # torch's product faster, but by less than the margin
        return C.ProductTiming(({"sum": 1.0, "matvec": (1 + C.MATVEC_MARGIN) / 2},))

    monkeypatch.setattr(C, "time_products", close)
    assert C.CompileState().matvec_shapes(rm.preset("tiny"), torch.float32) == ()


def test_one_disturbed_round_does_not_choose_the_product():

    def timing(*rounds: tuple[float, float]) -> C.ProductTiming:
        return C.ProductTiming(tuple({"sum": s, "matvec": m} for s, m in rounds))

    # torch's product faster in every round: chosen, and the reason says by how much
    choice = C.choose_product(timing(*[(2.0, 1.0)] * 9))
    assert choice.product == "matvec"
    assert "0.50 (median of 9 paired rounds), 0.50 best over best: both below 0.9" in choice.reason
    # another process took the cores during one round's sum-written turn: best over best alone
    # would pick matvec (1.9 against the disturbed 20), the paired median does not
    assert C.choose_product(timing(*[(1.0, 2.0)] * 8, (20.0, 1.9))).product == "sum"
    # one disturbed matvec turn does not hide a product faster in the other rounds
    assert C.choose_product(timing(*[(2.0, 1.0)] * 8, (2.0, 30.0))).product == "matvec"
    # the paired median below the margin but not the best rounds: the fused product stays
    choice = C.choose_product(timing((1.0, 0.5), (1.0, 0.5), (0.2, 0.5)))
    assert choice.product == "sum"
    assert "0.50 (median of 3 paired rounds), 2.50 best over best" in choice.reason


def test_a_one_row_projection_kept_as_matvec_in_a_compiled_graph_gives_the_product():
    from recurrent_model import functional as fn

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 1, 48, generator=g), torch.randn(80, 48, generator=g)
    kept = torch.compile(lambda x, w: fn.linear(x, w, {(80, 48)}), fullgraph=True)(x, w)
    summed = torch.compile(lambda x, w: fn.linear(x, w), fullgraph=True)(x, w)
    torch.testing.assert_close(kept, x @ w.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(summed, x @ w.T, rtol=1e-5, atol=1e-5)
