"""The diffusion sampler at its limits: the model's context, a wave capped by max_wavefront under
"fixed" freezing, and a grid of small settings that each either run or refuse in one named line.

The model is the tiny preset with its weights scaled by 3 (so that states keep moving and waves
grow) and, where a short context keeps the test fast, its block_size lowered to 32.
"""

from __future__ import annotations

import itertools
import re
import warnings

import pytest
import torch

import recurrent_model as rm
from recurrent_model.diffusion import FREEZE_STRATEGIES, DiffusionOutput, generate_diffusion

STOP_REASONS = {"max_new_tokens", "stop_token", "max_diffusion_steps", "context"}


def scaled_tiny(block_size: int | None = None) -> rm.RecurrentLM:
    """The tiny preset over 256 tokens, weights of seed 0 times 3."""
    torch.manual_seed(0)
    overrides = {} if block_size is None else {"block_size": block_size}
    model = rm.RecurrentLM(rm.preset("tiny", vocab_size=256, **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.fixture(scope="module")
def tiny() -> rm.RecurrentLM:
    return scaled_tiny()


@pytest.fixture(scope="module")
def short() -> rm.RecurrentLM:
    return scaled_tiny(block_size=32)


def ids(n: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(1))


def details(model: rm.RecurrentLM, prompt: torch.Tensor, new: int, **kw) -> DiffusionOutput:
    opts = dict(num_steps=8, inner_recurrence=2, init_scale=0.0, stop_tokens=(),
                max_diffusion_steps=60, generator=torch.Generator().manual_seed(5))  # fmt: skip
    opts.update(kw)
    out = generate_diffusion(model, prompt, new, return_details=True, **opts)
    assert isinstance(out, DiffusionOutput)
    return out


@pytest.mark.parametrize("strategy, prefill", [("latent-diff", True), ("token-stability", False)])
def test_a_wave_that_reaches_the_context_stops_and_says_so(tiny, strategy, prefill):
    """headway 3 with (almost) nothing freezing (exit_t 0; token-stability's horizon of 4 sampler
    steps met at most once, depending on the float rounding of the thread count): the sequence
    outgrows the 128-token context; the sampler stops there, records the step and warns with the
    number of tokens it froze."""
    P = 5
    kw = dict(headway=3, exit_t=0.0, freeze_strategy=strategy, full_prefill=prefill)
    with pytest.warns(
        RuntimeWarning, match=r"context \(128 tokens\) with [01] of max_new_tokens=10"
    ) as caught:
        out = details(tiny, ids(P), 10, **kw)
    message = next(str(w.message) for w in caught if "context" in str(w.message))
    frozen = int(re.search(r"with (\d+) of", message).group(1))
    assert out.stop_reason == "context"
    assert out.sequences.shape[1] == P + frozen >= P + int(prefill)
    last = int(out.sequence_lengths[-1])
    assert 128 < last <= 128 + 3 and out.token_tablet.shape[1] == last
    with pytest.warns(RuntimeWarning, match="context"):
        plain = generate_diffusion(tiny, ids(P), 10, num_steps=8, inner_recurrence=2,
                                   init_scale=0.0, stop_tokens=(), **kw)  # fmt: skip
    assert torch.equal(plain, out.sequences)


def test_a_run_that_reaches_max_new_tokens_does_not_warn(short):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = details(short, ids(5), 4, headway=2, freeze_strategy="fixed")
    assert out.stop_reason == "max_new_tokens" and out.sequences.shape == (1, 9)


@pytest.mark.parametrize("headway", [1, 3])
def test_fixed_with_a_capped_wave_freezes_headway_per_step(tiny, headway):
    """max_wavefront 6 caps the wave during the warm-up; afterwards every step still freezes
    ``headway`` guesses and the next wave starts at the last frozen token."""
    P, warmup = 5, 8 // 2
    out = details(tiny, ids(P), 10, headway=headway, freeze_strategy="fixed", max_wavefront=6)
    assert out.stop_reason == "max_new_tokens" and out.sequences.shape == (1, P + 10)
    assert out.standing_waves > 0 and int(out.wave_widths.max()) <= 6
    lengths = out.frozen_lengths.tolist()
    assert lengths[: warmup + 1] == [P + 1] * (warmup + 1)
    assert all(b - a == headway for a, b in zip(lengths[warmup:], lengths[warmup + 1 :]))
    starts = out.wave_starts.tolist()
    assert starts == [P] + [n - 1 for n in lengths[:-1]]


@pytest.mark.parametrize("headway", [2, 3])
def test_fixed_without_prefill_and_a_capped_wave(tiny, headway):
    """The prompt fills most of the wave: fewer guesses fit than headway, so fewer freeze, and the
    frozen tokens never run past the sequence."""
    P = 5
    out = details(tiny, ids(P), 10, headway=headway, freeze_strategy="fixed", max_wavefront=6,
                  full_prefill=False, num_steps=4)  # fmt: skip
    assert out.stop_reason == "max_new_tokens" and out.sequences.shape == (1, P + 10)
    frozen, seq = out.frozen_lengths.tolist(), out.sequence_lengths.tolist()
    assert all(f <= s for f, s in zip(frozen, seq))
    assert all(0 <= b - a <= headway for a, b in zip(frozen, frozen[1:]))


def test_fixed_refuses_a_wave_filled_by_the_prompt(tiny):
    with pytest.raises(ValueError, match="at least 6$"):
        details(tiny, ids(5), 4, freeze_strategy="fixed", max_wavefront=5, full_prefill=False)
    out = details(tiny, ids(4), 4, freeze_strategy="fixed", max_wavefront=5, full_prefill=False)
    assert out.sequences.shape == (1, 8)


def test_a_latent_freeze_without_prefill_keeps_the_prompt(short):
    """The wave starts over the prompt; prompt positions that pass exit_t freeze nothing new
    instead of cutting the frozen tokens back into the prompt."""
    P = 5
    out = details(short, ids(P), 3, max_wavefront=6, full_prefill=False, exit_t=1.0, num_steps=4)
    assert torch.equal(out.sequences[:, :P], ids(P)) and out.sequences.shape == (1, P + 3)
    assert min(out.frozen_lengths.tolist()) >= P
    assert P - 1 in out.wave_starts.tolist()  # the wave moved up to the last prompt token


GRID = list(
    itertools.product(FREEZE_STRATEGIES, (1, 3), ("cap", 0), (True, False), ((3, 4), (12, 3)))
)


def test_small_grid_runs_or_names_the_problem():
    """Every (strategy, headway, max_wavefront, prefill, prompt / max_new filling a 16-token
    context) returns a well-formed answer or raises a one-line ValueError."""
    model, refused = scaled_tiny(block_size=16), 0
    for strategy, headway, cap, prefill, (P, new) in GRID:
        wavefront = headway + 1 if cap == "cap" else cap
        kw = dict(freeze_strategy=strategy, headway=headway, max_wavefront=wavefront,
                  full_prefill=prefill, num_steps=2, exit_t=0.5, max_diffusion_steps=8)  # fmt: skip
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a short run says so; see above
                out = details(model, ids(P), new, **kw)
        except ValueError as e:
            assert "\n" not in str(e) and not prefill, (kw, P, new, e)
            refused += 1
            continue
        case = (kw, P, new)
        assert out.stop_reason in STOP_REASONS, case
        n = out.sequences.shape[1] - P
        assert torch.equal(out.sequences[:, :P], ids(P)), case
        assert 0 <= n <= new and (n == new) == (out.stop_reason == "max_new_tokens"), case
        assert int(out.sequence_lengths.max()) <= 16 + headway, case
        assert out.frozen_lengths.tolist() == sorted(out.frozen_lengths.tolist()), case
    assert 0 < refused < len(GRID)
