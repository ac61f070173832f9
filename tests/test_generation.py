"""generate(): cached greedy equals full recomputation, speculative decoding, adaptive exit, options."""

from __future__ import annotations

import pytest
import torch

import recurrent_model as rm
from recurrent_model import hook_names
from recurrent_model.generation import GenerationOutput, generate
from recurrent_model.sampling import EXIT_CRITERIA


def greedy_by_recomputation(model, ids, new, steps, mask=None):
    """Greedy decoding that reruns the whole sequence without a cache for every token."""
    seq = ids
    for _ in range(new):
        with torch.no_grad():
            logits = model(seq, num_steps=steps, init_scale=0.0).logits[:, -1]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq


def prompt(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, length), generator=g)


@pytest.mark.parametrize(("steps", "batch", "length"), [(1, 1, 1), (3, 2, 7), (6, 3, 5)])
def test_cached_greedy_equals_recomputation(model, steps, batch, length):
    ids = prompt(batch, length, seed=steps)
    expected = greedy_by_recomputation(model, ids, 10, steps)
    got = generate(model, ids, 10, num_steps=steps, init_scale=0.0, stop_tokens=())
    assert torch.equal(got, expected)


def test_hooked_path_matches_fast_path(model):
    ids = prompt(2, 6)
    fast = generate(model, ids, 6, num_steps=3, init_scale=0.0, return_details=True,
                    output_scores=True)  # fmt: skip
    with model.hooks([(hook_names.STATE, lambda x, hook: None)]):
        hooked = generate(model, ids, 6, num_steps=3, init_scale=0.0, return_details=True,
                          output_scores=True)  # fmt: skip
    assert torch.equal(fast.sequences, hooked.sequences)
    torch.testing.assert_close(fast.scores, hooked.scores, rtol=1e-4, atol=1e-4)


def test_hooks_steer_generation(model):
    ids = prompt(1, 4)
    plain = generate(model, ids, 6, num_steps=3, init_scale=0.0, output_scores=True,
                     return_details=True)  # fmt: skip
    with model.hooks([(hook_names.STATE, lambda x, hook: x * 0 if hook.step == 3 else None)]):
        steered = generate(model, ids, 6, num_steps=3, init_scale=0.0, output_scores=True,
                           return_details=True)  # fmt: skip
    assert not torch.allclose(plain.scores, steered.scores)


def test_left_padded_batch_matches_single_rows(model):
    a, b = prompt(1, 6, seed=3), prompt(1, 3, seed=4)
    pad = 7
    ids = torch.cat([a, torch.cat([torch.full((1, 3), pad), b], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    out = generate(model, ids, 8, num_steps=3, init_scale=0.0, attention_mask=mask,
                   stop_tokens=())  # fmt: skip
    alone_a = generate(model, a, 8, num_steps=3, init_scale=0.0, stop_tokens=())
    alone_b = generate(model, b, 8, num_steps=3, init_scale=0.0, stop_tokens=())
    assert torch.equal(out[0], alone_a[0])
    assert torch.equal(out[1, 3:], alone_b[0])


@pytest.mark.parametrize(("batch", "lookahead"), [(1, 3), (2, 5)])
def test_speculative_equals_plain_greedy(model, batch, lookahead):
    ids = prompt(batch, 5, seed=lookahead)
    plain = generate(model, ids, 12, num_steps=6, init_scale=0.0, stop_tokens=())
    spec = generate(model, ids, 12, num_steps=6, init_scale=0.0, stop_tokens=(), draft_steps=2,
                    lookahead=lookahead, return_details=True)  # fmt: skip
    assert torch.equal(spec.sequences, plain)
    assert spec.drafted > 0 and 0.0 <= spec.acceptance_rate <= 1.0
    assert (spec.steps == 6).all()


def test_speculative_sampling_runs_and_reports(model):
    g = torch.Generator().manual_seed(0)
    out = generate(model, prompt(2, 4), 10, num_steps=4, do_sample=True, top_k=20, generator=g,
                   draft_steps=1, lookahead=4, return_details=True, stop_tokens=())  # fmt: skip
    assert out.sequences.shape == (2, 14)
    assert 0.0 <= out.acceptance_rate <= 1.0


@pytest.mark.parametrize("criterion", ["kl", "latent-diff", "entropy-diff", "cosine"])
def test_exit_threshold_zero_and_huge(model, criterion):
    ids = prompt(2, 4)
    full = generate(model, ids, 5, num_steps=6, exit_criterion=criterion, exit_threshold=0.0,
                    return_details=True, stop_tokens=(), init_scale=0.0)  # fmt: skip
    assert (full.steps == 6).all()
    plain = generate(model, ids, 5, num_steps=6, init_scale=0.0, stop_tokens=())
    assert torch.equal(full.sequences, plain)
    early = generate(model, ids, 5, num_steps=6, exit_criterion=criterion, exit_threshold=1e9,
                     min_steps=2, return_details=True, stop_tokens=())  # fmt: skip
    assert (early.steps == 2).all()


def test_argmax_stability_counts_steps(model):
    out = generate(model, prompt(1, 4), 4, num_steps=8, exit_criterion="argmax-stability",
                   exit_threshold=2, return_details=True, stop_tokens=())  # fmt: skip
    assert ((out.steps >= 3) & (out.steps <= 8)).all()


def test_stop_tokens_pad_finished_rows(model):
    ids = prompt(2, 4)
    free = generate(model, ids, 6, num_steps=2, init_scale=0.0, stop_tokens=())
    stop = int(free[0, 5])  # row 0's second new token
    out = generate(model, ids, 6, num_steps=2, init_scale=0.0, stop_tokens=[stop],
                   pad_token_id=0, return_details=True)  # fmt: skip
    row = out.sequences[0, 4:].tolist()
    first = row.index(stop)
    assert all(t == 0 for t in row[first + 1 :])
    assert (out.steps[0, first + 1 :] == 0).all()


def test_stop_when_all_rows_finish(model):
    # The stop token is the third token of greedy decoding by full recomputation: generation ends
    # right after its first occurrence, with exactly the recomputed tokens up to there.
    ids = prompt(1, 4)
    reference = greedy_by_recomputation(model, ids, 6, 2)
    stop = int(reference[0, 6])
    end = 4 + reference[0, 4:].tolist().index(stop) + 1
    out = generate(model, ids, 6, num_steps=2, init_scale=0.0, stop_tokens=[stop])
    assert torch.equal(out, reference[:, :end])


def test_streamer_sees_every_token(model):
    seen = []
    out = generate(model, prompt(2, 3), 5, num_steps=2, stop_tokens=(),
                   streamer=lambda tokens, steps: seen.append((tokens.clone(), steps.clone())))  # fmt: skip
    assert torch.equal(torch.stack([t for t, _ in seen], dim=1), out[:, 3:])
    assert all((s == 2).all() for _, s in seen)


def test_sampling_is_reproducible_and_filters(model):
    ids = prompt(1, 3)

    def run(**kw):
        g = torch.Generator().manual_seed(5)
        return generate(model, ids, 8, num_steps=2, do_sample=True, generator=g, stop_tokens=(),
                        init_scale=0.0, **kw)  # fmt: skip

    assert torch.equal(run(temperature=0.7), run(temperature=0.7))
    greedy = generate(model, ids, 8, num_steps=2, init_scale=0.0, stop_tokens=())
    assert torch.equal(run(top_k=1), greedy)
    assert torch.equal(run(min_p=1.0), greedy)
    assert torch.equal(run(top_p=1e-6), greedy)


def test_continuous_compute_warm_starts(model):
    ids = prompt(1, 5)
    states = []

    def record(x, hook):
        if hook.step == 0:
            states.append(x.clone())

    with model.hooks([(hook_names.STATE, record)]):
        out = generate(model, ids, 3, num_steps=3, continuous_compute=True, stop_tokens=(),
                       init_scale=0.0, return_details=True)  # fmt: skip
    assert out.sequences.shape == (1, 8)
    # prefill (4 tokens, from zeros), then 3 tokens each warm-started from a latent
    assert torch.count_nonzero(states[0]) == 0
    assert all(torch.count_nonzero(s) > 0 for s in states[1:])
    assert torch.allclose(states[1].norm(dim=-1), states[2].norm(dim=-1), rtol=0.2)


def test_details_and_generate_method(model):
    ids = prompt(1, 3)
    out = model.generate(ids, 4, num_steps=2, init_scale=0.0, return_details=True, stop_tokens=())
    assert isinstance(out, GenerationOutput)
    assert out.steps.shape == (1, 4) and out.mean_steps == 2.0
    assert out.acceptance_rate is None and out.cache_bytes > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(exit_criterion="nope"), "unknown exit criterion"),
        (dict(exit_criterion="kl", exit_threshold=-1.0), "exit_threshold"),
        (dict(min_steps=2), "need an exit_criterion"),
        (dict(exit_criterion="kl", min_steps=5, max_steps=3), "exceeds max_steps"),
        (dict(lookahead=3), "needs draft_steps"),
        (dict(draft_steps=1, exit_criterion="kl"), "cannot be combined"),
        (dict(num_steps=0), "num_steps"),
        (dict(cache_budget=0), "cache_budget"),
        (dict(temperature=0.0, do_sample=True), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(attention_mask=torch.tensor([[1, 1, 0]])), "left padding"),
    ],
)
def test_bad_arguments(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, prompt(1, 3), 2, **kwargs)


def test_compile_refuses_what_it_cannot_run_instead_of_decoding_eagerly(model):
    from recurrent_model.generation import CompileConflict

    with pytest.raises(CompileConflict, match="cannot honour exit_criterion='kl'"):
        generate(model, prompt(1, 3), 2, exit_criterion="kl", compile=True)
    with pytest.raises(TypeError, match="draft_steps=1"):  # outside checks retry without compile
        generate(model, prompt(1, 3), 2, draft_steps=1, compile=True)
    with model.hooks([(hook_names.STATE, lambda x, hook: None)]):
        with pytest.raises(ValueError, match="hooks on core.hook_state"):
            generate(model, prompt(1, 3), 2, compile=True)


def test_exit_criteria_on_a_zero_or_nan_state(model):
    from recurrent_model.criteria import CRITERIA, NonFiniteState, relative_norm

    zero = lambda x, hook: torch.zeros_like(x) if hook.step else None  # noqa: E731
    kw = dict(num_steps=4, init_scale=0.0, return_details=True, stop_tokens=())
    for name in ("latent-diff", "cosine"):  # a zero state that stays zero did not move
        with model.hooks([(hook_names.STATE, zero)]):
            out = generate(model, prompt(1, 3), 2, exit_criterion=name, **kw)
        assert out.steps.tolist() == [[1, 1]], name
    nan = lambda x, hook: x * float("nan") if hook.step else None  # noqa: E731
    for name in ("latent-diff", "cosine", "kl"):
        with model.hooks([(hook_names.STATE, nan)]):
            with pytest.raises(NonFiniteState, match=f"the {name} criterion is NaN"):
                generate(model, prompt(1, 3), 2, exit_criterion=name, **kw)
    ratio = relative_norm(torch.tensor([[0.0, 0.0], [1.0, 0.0]]), torch.zeros(2, 2))
    assert ratio.tolist() == [0.0, float("inf")]
    assert set(EXIT_CRITERIA) <= set(CRITERIA) and CRITERIA["latent-diff"].used_by == (
        "generate", "diffusion")  # fmt: skip


def test_context_errors(model):
    with pytest.raises(rm.ContextLengthError, match="prompt has 129 tokens"):
        generate(model, prompt(1, 129), 1)
    with pytest.raises(rm.ContextLengthError, match="at most 28"):
        generate(model, prompt(1, 100), 40)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(model, torch.tensor([[600]]), 1)


def test_bfloat16_model_generates():
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).eval().to(torch.bfloat16)
    ids = prompt(2, 4)
    fixed = generate(model, ids, 5, num_steps=3, init_scale=0.0, stop_tokens=())
    assert torch.equal(fixed, greedy_by_recomputation(model, ids, 5, 3))  # bf16 without a cache
    out = generate(model, ids, 5, num_steps=3, init_scale=0.0, stop_tokens=(),
                   exit_criterion="kl", exit_threshold=1e-2, return_details=True)  # fmt: skip
    assert out.sequences.shape == (2, 9) and out.sequences.dtype == torch.long
    assert torch.equal(out.sequences[:, :4], ids)
    assert ((out.steps >= 1) & (out.steps <= 3)).all()
    assert out.cache_bytes == rm.KVCache(model.config, 2, 9, 3).memory_bytes // 2  # 2 bytes


def test_generated_ids_can_be_trained_on():
    """generate runs in inference mode, but what it returns is an ordinary tensor."""
    import recurrent_model as rm

    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny")).train()
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    details = model.generate(ids, 3, num_steps=2, stop_tokens=[], return_details=True)
    assert not details.sequences.is_inference() and not details.steps.is_inference()
    model(details.sequences, num_steps=2, labels=details.sequences).loss.backward()


def test_speculative_sampling_draws_from_the_target_distribution(model):
    """The accept/resample rule leaves the verified model's distribution intact: the first token of
    speculative sampling follows the full-depth distribution p exactly (chi-square goodness of fit),
    although the drafts come from a clearly different distribution q; the first two tokens jointly
    match plain sampling's (chi-square test of homogeneity)."""
    from scipy.stats import chi2_contingency, chisquare

    from recurrent_model.sampling import Sampler

    n, steps, draft = 4000, 8, 1
    ids = prompt(1, 5, seed=5)  # p and q overlap by about half: drafts are often accepted
    options = dict(num_steps=steps, do_sample=True, temperature=0.5, top_k=4, init_scale=0.0,
                   stop_tokens=())  # fmt: skip
    sampler = Sampler(do_sample=True, temperature=0.5, top_k=4)
    with torch.no_grad():
        p = sampler.probs(model(ids, num_steps=steps, init_scale=0.0).logits[:, -1])[0]
        q = sampler.probs(model(ids, num_steps=draft, init_scale=0.0).logits[:, -1])[0]
    assert 0.5 * (p - q).abs().sum() > 0.4  # drafts alone would fail the test below
    batch = ids.expand(n, -1)
    spec = generate(model, batch, 2, draft_steps=draft, lookahead=2,
                    generator=torch.Generator().manual_seed(1), **options)[:, -2:]  # fmt: skip
    plain = generate(model, batch, 2, generator=torch.Generator().manual_seed(2), **options)[:, -2:]

    support = torch.nonzero(p > 0).squeeze(-1)
    first = torch.bincount(spec[:, 0], minlength=p.numel())
    assert first.sum() == first[support].sum()  # nothing outside the target's support
    observed = first[support].double().numpy()

    def expected(dist):
        d = dist[support].double()
        return (n * d / d.sum()).numpy()

    assert chisquare(observed, expected(p)).pvalue > 1e-3
    assert 0.5 * (first / n - q).abs().sum() > 0.3  # far from the drafts' distribution

    pairs = sorted({tuple(r) for r in torch.cat([spec, plain]).tolist()})
    index = {pair: i for i, pair in enumerate(pairs)}
    table = torch.zeros(2, len(pairs))
    for row, sample in enumerate((spec, plain)):
        for pair in sample.tolist():
            table[row, index[tuple(pair)]] += 1
    table = table[:, table.sum(0) >= 10]  # the test's approximation needs populated cells
    assert chi2_contingency(table.numpy()).pvalue > 1e-3
