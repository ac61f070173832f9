"""The diffusion-forcing sampler against a slow step-by-step reference written plainly here.

The reference runs the model's own modules (``prelude`` / ``core_step`` / ``coda``) over a dictionary
cache that stores one key/value entry per layer call and position, like the published sampler's
cache, and tracks the wave by absolute positions. The sampler's semantics depend on stale cache
entries of earlier steps (frozen positions keep the keys of the step that last refined them), so a
reference without any cache cannot express it; this one shares no code with the fast sampler's
preallocated ring cache, fused layers or index arithmetic.
"""

from __future__ import annotations

import pytest
import torch

from recurrent_model import RecurrentConfig, RecurrentLM, hook_names
from recurrent_model.diffusion import DiffusionOutput, generate_diffusion

V = 96


def make_model(block_size: int) -> RecurrentLM:
    """A 32-wide model over a 96-token vocabulary with the random weights of seed 3."""
    torch.manual_seed(3)
    cfg = RecurrentConfig(
        n_embd=32, n_heads=2, n_layers_in_prelude=1, n_layers_in_recurrent_block=2,
        n_layers_in_coda=1, intermediate_size=64, vocab_size=V, block_size=block_size,
        mean_recurrence=6,
    )  # fmt: skip
    return RecurrentLM(cfg).eval()


@pytest.fixture(scope="module")
def small_model() -> RecurrentLM:
    return make_model(256)


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(5))


class DictCache:
    """Per layer call a dict position -> (k, v); ``compress`` stores core layer j of every iteration in
    one entry (later iterations overwrite earlier ones)."""

    def __init__(self, config: RecurrentConfig, compress: bool) -> None:
        self.n_prelude = config.n_layers_in_prelude
        self.n_core = config.n_layers_in_recurrent_block
        self.compress = compress
        self.entries: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.start = 0

    def slot(self, index: int) -> DictSlot:
        if self.compress and index >= self.n_prelude:
            index = self.n_prelude + (index - self.n_prelude) % self.n_core
        return DictSlot(self, self.entries.setdefault(index, {}))

    def drop_from(self, position: int) -> None:
        for store in self.entries.values():
            for p in [p for p in store if p >= position]:
                del store[p]


class DictSlot:
    def __init__(self, cache: DictCache, store: dict) -> None:
        self.cache, self.store = cache, store

    def update(self, k: torch.Tensor, v: torch.Tensor):
        start, T = self.cache.start, k.shape[2]
        for t in range(T):
            self.store[start + t] = (k[:, :, t], v[:, :, t])
        end = start + T
        keys = torch.stack([self.store[p][0] for p in range(end)], dim=2)
        values = torch.stack([self.store[p][1] for p in range(end)], dim=2)
        mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        return keys, values, mask


def slow_diffusion(
    model: RecurrentLM,
    prompt: torch.Tensor,
    max_new: int,
    num_steps: int,
    inner: int,
    headway: int = 1,
    max_wavefront: int = 128,
    exit_t: float = 0.03,
    ema: float = 0.1,
    mixing: float = 0.5,
    compress: bool = True,
    generator: torch.Generator | None = None,
    strategy: str = "latent-diff",
) -> list[int]:
    """Greedy, init_scale = 0, latent-diff or fixed freezing; returns the frozen tokens (prompt
    included)."""
    h = model.config.n_embd
    cache = DictCache(model.config, compress)
    P = prompt.shape[1]
    tokens = prompt[0].tolist()
    with torch.no_grad():
        rope = model.rope_at(0, P)
        e = model.prelude(model.embed(prompt), rope, cache)
        s = torch.zeros(1, P, h)
        for i in range(1, num_steps + 1):
            s = model.core_step(s, e, rope, i, cache)
        logits, _ = model.coda(s, rope, cache)
        tokens.append(int(logits[0, -1].argmax()))
        frozen = len(tokens)
        iterations = {p: num_steps for p in range(frozen)}
        seq_ids = torch.tensor([tokens])
        full_e = model.prelude(model.embed(seq_ids), model.rope_at(0, frozen))
        e_old = {p: full_e[0, p] for p in range(frozen)}
        start = P  # first wave position
        wave = [torch.zeros(h)]  # states of positions start, start + 1, ...
        prev, prev_start = [w.clone() for w in wave], 0
        sequence = list(tokens)
        step = 0
        while frozen - P < max_new and len(sequence) <= model.config.block_size:
            W = len(wave)
            cache.drop_from(start)
            cache.start = start
            rope = model.rope_at(start, W)
            e_new = model.prelude(
                model.embed(torch.tensor([sequence[start : start + W]])), rope, cache
            )
            mixed = []
            for i, p in enumerate(range(start, start + W)):
                row = e_new[0, i] * (1 - ema)
                mixed.append(row + e_old[p] * ema if p in e_old else row)
            e_old = {p: mixed[i] for i, p in enumerate(range(start, start + W))}
            e = torch.stack(mixed)[None]
            counts = torch.tensor([iterations.get(p, 0) for p in range(start, start + W)])
            lam = mixing / (1 + counts)
            s = torch.stack(wave)[None] * (1 - lam[None, :, None])
            for i in range(1, inner + 1):
                s = model.core_step(s, e, rope, i, cache)
                for p in range(start, start + W):
                    iterations[p] = iterations.get(p, 0) + 1
            logits, _ = model.coda(s, rope, cache)
            # the state at position p guesses token p + 1; guesses from the last frozen position on
            guesses = [
                int(logits[0, p - start].argmax()) for p in range(max(frozen - 1, start), start + W)
            ]
            placeholders = torch.randint(0, V, (1, headway - 1), generator=generator)[0].tolist()
            sequence = sequence[:frozen] + guesses + placeholders
            wave = [s[0, i] for i in range(W)] + [torch.zeros(h) for _ in range(headway)]
            if max_wavefront and len(wave) > max_wavefront:
                wave = wave[:max_wavefront]
                sequence = sequence[: start + max_wavefront]
            if strategy == "fixed":
                due = step > num_steps // inner
                frozen, start, wave = fixed_freeze(
                    due, headway, frozen, start, wave, sequence, guesses
                )
                step += 1
                continue
            # The published sampler compares the wave's state at position p with last step's state at
            # position p + (start − previous start): the same position unless the previous step froze.
            shift = start - prev_start
            last_exit = None
            for i in range(len(wave)):
                if i + shift >= len(prev):
                    break
                diff = (wave[i] - prev[i + shift]).norm() / wave[i].norm()
                if diff < exit_t:
                    last_exit = start + i
            new_start = start
            if last_exit is not None:
                frozen = last_exit + 1
                new_start = last_exit  # the last frozen position stays in the wave
                wave = wave[new_start - start :]
            prev, prev_start = [w.clone() for w in wave], start
            start = new_start
        return sequence[:frozen]


def fixed_freeze(due: bool, headway: int, frozen: int, start: int, wave: list, sequence: list,
                 guesses: list) -> tuple[int, int, list]:  # fmt: skip
    """The "fixed" strategy: once due, the first ``headway`` guesses still in ``sequence`` (the
    wavefront cut may have dropped some) freeze and the wave's first states leave with them."""
    if not due:
        return frozen, start, wave
    n = min(headway, len(guesses), len(sequence) - frozen)
    return frozen + n, start + n, wave[n:]


CASES = {
    "defaults": {},
    "full cache": {"compress": False},
    "headway 3": {"headway": 3},
    "standing wave": {"max_wavefront": 3, "headway": 2},
    "eager freezing": {"exit_t": 0.3},
    "fixed": {"strategy": "fixed", "headway": 2},
    "fixed standing wave": {"strategy": "fixed", "max_wavefront": 4},
    "fixed standing wave headway 2": {"strategy": "fixed", "max_wavefront": 3, "headway": 2},
}


@pytest.mark.parametrize("case", CASES)
def test_tokens_equal_the_slow_reference(small_model, prompt, case):
    kw = CASES[case]
    max_new, num_steps, inner = 10, 6, 2
    expected = slow_diffusion(small_model, prompt, max_new, num_steps, inner,
                              generator=torch.Generator().manual_seed(7), **kw)  # fmt: skip
    fast_kw = {k: v for k, v in kw.items() if k not in ("compress", "strategy")}
    fast_kw["freeze_strategy"] = kw.get("strategy", "latent-diff")
    if kw.get("compress") is False:
        fast_kw["cache_lookup_strategy"] = "full"
    out = generate_diffusion(
        small_model, prompt, max_new, num_steps=num_steps, inner_recurrence=inner, init_scale=0.0,
        generator=torch.Generator().manual_seed(7), stop_tokens=(), return_details=True, **fast_kw,
    )  # fmt: skip
    assert isinstance(out, DiffusionOutput)
    assert out.frozen[0].tolist() == expected
    assert out.sequences[0].tolist() == expected[: prompt.shape[1] + max_new]
    # the sampler really ran in parallel: some step froze more than one token or the wave was wide
    assert int(out.wave_widths.max()) > 1
    if case == "standing wave":
        assert out.standing_waves > 0 and int(out.wave_widths.max()) == 3
    if "max_wavefront" in kw:
        assert out.standing_waves > 0 and int(out.wave_widths.max()) <= kw["max_wavefront"]


def test_context_stop_equals_the_slow_reference(prompt):
    """headway 3 pushes the sequence (frozen, guesses, placeholders) past a 24-token context: the
    sampler stops there with the reference's tokens, records that last step and says so."""
    model, P, max_new = make_model(24), prompt.shape[1], 10
    kw = dict(headway=3, exit_t=0.5)
    expected = slow_diffusion(model, prompt, max_new, 6, 4, generator=torch.Generator().manual_seed(7),
                              **kw)  # fmt: skip
    with pytest.warns(RuntimeWarning, match=r"context \(24 tokens\) with \d+ of max_new_tokens=10"):
        out = generate_diffusion(model, prompt, max_new, num_steps=6, inner_recurrence=4,
                                 init_scale=0.0, generator=torch.Generator().manual_seed(7),
                                 stop_tokens=(), return_details=True, **kw)  # fmt: skip
    assert out.stop_reason == "context"
    assert out.frozen[0].tolist() == expected and P + 1 < len(expected) < P + max_new
    last = int(out.sequence_lengths[-1])
    assert last > 24 and out.token_tablet.shape[1] == last
    assert out.token_tablet.shape[0] == out.sampler_steps == len(out.sequence_lengths)


def test_tablets_are_consistent(small_model, prompt):
    inner, num_steps, P = 2, 6, prompt.shape[1]
    out = generate_diffusion(small_model, prompt, 12, num_steps=num_steps, inner_recurrence=inner,
                             init_scale=0.0, headway=2, stop_tokens=(), return_details=True)  # fmt: skip
    steps = out.sampler_steps
    assert out.token_tablet.shape[0] == steps == len(out.frozen_lengths)
    lengths = out.frozen_lengths.tolist()
    assert lengths == sorted(lengths) and lengths[-1] == out.frozen.shape[1]
    for t in range(steps):
        n = lengths[t]
        assert torch.equal(out.frozen_tablet[t, :n], out.token_tablet[t, :n])
        assert bool((out.frozen_tablet[t, n:] == -1).all())
        if t:  # frozen tokens never change
            m = lengths[t - 1]
            assert torch.equal(out.frozen_tablet[t, :m], out.frozen_tablet[t - 1, :m])
    seq = out.token_tablet[out.token_tablet >= 0]
    assert int(seq.max()) < V  # placeholders of headway 2 come from the model's vocabulary
    # iterations: prompt and first token at num_steps; each step adds inner on exactly its wave
    counter = out.counter_tablet
    first = torch.zeros(counter.shape[1], dtype=torch.long)
    first[: P + 1] = num_steps
    previous = first
    for t in range(steps):
        a, w = int(out.wave_starts[t]), int(out.wave_widths[t])
        expected = previous.clone()
        expected[a : a + w] += inner
        assert torch.equal(counter[t], expected)
        previous = counter[t]
    assert torch.equal(out.recurrence_per_position, counter[-1, : out.frozen.shape[1]])
    assert out.core_passes == 1 + inner * steps
    assert out.tokens_forwarded == P + inner * int(out.wave_widths.sum())
    # stability: prompt positions agree with themselves at every step
    assert bool((out.stability_tablet[-1, :P] == steps).all())


def test_stop_token_ends_generation(small_model, prompt):
    num_steps, inner = 2, 2
    kw = dict(num_steps=num_steps, inner_recurrence=inner, init_scale=0.0, return_details=True)
    free = generate_diffusion(small_model, prompt, 40, stop_tokens=(), **kw)
    P = prompt.shape[1]
    # a token first frozen after step num_steps (when the sampler starts checking stops)
    lengths = free.frozen_lengths.tolist()
    t = next(t for t in range(num_steps + 1, len(lengths)) if lengths[t] > lengths[t - 1])
    stop = int(free.frozen[0, lengths[t] - 1])
    first = free.frozen[0, P:].tolist().index(stop)
    out = generate_diffusion(small_model, prompt, 40, stop_tokens=(stop,), **kw)
    assert out.sequences[0, P:].tolist() == free.frozen[0, P : P + first + 1].tolist()
    assert out.sampler_steps < free.sampler_steps


def test_other_strategies_and_sampling(small_model, prompt):
    P = prompt.shape[1]
    for strategy in ("latent-acceleration-1", "latent-acceleration-2", "token-stability", "fixed"):
        out = generate_diffusion(small_model, prompt, 8, num_steps=4, inner_recurrence=2, stop_tokens=(),
                                 freeze_strategy=strategy, return_details=True, max_wavefront=16,
                                 generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert out.sequences.shape == (1, P + 8), strategy
        lengths = out.frozen_lengths.tolist()
        assert lengths == sorted(lengths), strategy
    # "fixed" freezes headway tokens per step once past num_steps // inner_recurrence steps
    out = generate_diffusion(small_model, prompt, 8, num_steps=4, inner_recurrence=2, headway=2,
                             freeze_strategy="fixed", stop_tokens=(), return_details=True)  # fmt: skip
    assert out.frozen_lengths.tolist()[:4] == [P + 1, P + 1, P + 1, P + 3]
    kw = dict(
        num_steps=4,
        inner_recurrence=2,
        do_sample=True,
        temperature=0.8,
        stop_tokens=(),
        max_wavefront=16,
        max_diffusion_steps=40,
    )
    a = generate_diffusion(small_model, prompt, 8, generator=torch.Generator().manual_seed(1), **kw)
    b = generate_diffusion(small_model, prompt, 8, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(a, b) and P < a.shape[1] <= P + 8 and int(a.max()) < V


def test_hooked_path_and_method_agree(small_model, prompt):
    kw = dict(num_steps=4, inner_recurrence=2, init_scale=0.0, stop_tokens=())
    fast = generate_diffusion(small_model, prompt, 6, **kw)
    with small_model.hooks([(hook_names.STATE, lambda x, hook: None)]):
        hooked = generate_diffusion(small_model, prompt, 6, **kw)
    assert torch.equal(fast, hooked)
    assert torch.equal(small_model.generate_diffusion(prompt, 6, **kw), fast)


def test_bad_input_is_refused(small_model, prompt):
    with pytest.raises(ValueError, match="one sequence"):
        generate_diffusion(small_model, prompt.repeat(2, 1), 4)
    with pytest.raises(ValueError, match="freeze_strategy"):
        generate_diffusion(small_model, prompt, 4, freeze_strategy="never")
    with pytest.raises(ValueError, match="max_wavefront"):
        generate_diffusion(small_model, prompt, 4, headway=4, max_wavefront=2)
    with pytest.raises(ValueError, match="cache_lookup_strategy"):
        generate_diffusion(small_model, prompt, 4, cache_lookup_strategy="skip")


def test_a_zero_state_freezes_and_a_nan_state_is_an_error(small_model, prompt):
    from recurrent_model.criteria import NonFiniteState

    P = prompt.shape[1]
    kw = dict(num_steps=4, inner_recurrence=2, init_scale=0.0, stop_tokens=(), return_details=True,
              max_diffusion_steps=40)  # fmt: skip
    with small_model.hooks([(hook_names.STATE, lambda x, hook: torch.zeros_like(x))]):
        out = generate_diffusion(small_model, prompt, 6, **kw)
    assert out.sequences.shape == (1, P + 6) and out.sampler_steps < 40  # 0/0: it did not move
    for strategy in ("latent-diff", "latent-acceleration-1"):
        with small_model.hooks([(hook_names.STATE, lambda x, hook: x * float("nan"))]):
            with pytest.raises(NonFiniteState, match=f"the {strategy} criterion is NaN"):
                generate_diffusion(small_model, prompt, 6, freeze_strategy=strategy, **kw)
