"""KVCache: slot mapping, sharing budgets, memory, and the mixed-depth rule against slow references."""

from __future__ import annotations

import pytest
import torch

from recurrent_model.generation import generate
from recurrent_model.kv_cache import KVCache

STEPS = 6


def prompt(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, length), generator=g)


class DictCache:
    """A slow reference cache: a dictionary per storage key, one entry per position.

    ``key(index, pos)`` names where layer call ``index`` of token ``pos`` lives; the attention of the
    current token gathers every earlier position's entry for the same key rule.
    """

    def __init__(self, key):
        self.key = key
        self.store: dict = {}
        self.pos = 0

    def slot(self, index):
        return DictSlot(self, index)


class DictSlot:
    def __init__(self, cache: DictCache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(self, k, v):
        c = self.cache
        c.store[c.key(self.index, c.pos, c.pos)] = (k, v)
        entries = [c.store[c.key(self.index, p, c.pos)] for p in range(c.pos + 1)]
        ks = torch.cat([e[0] for e in entries], dim=2)
        vs = torch.cat([e[1] for e in entries], dim=2)
        return ks, vs, None


def reference_decode(model, ids, steps_per_position, key_rule):
    """Token-by-token forward with a DictCache; returns logits (len, V) for every position."""
    cache = DictCache(key_rule)
    out = []
    with torch.no_grad():
        for pos in range(ids.shape[1]):
            cache.pos = pos
            rope = model.rope_at(pos, 1)
            e = model.prelude(model.embed(ids[:, pos : pos + 1]), rope, cache)
            s = torch.zeros_like(e)
            for step in range(1, steps_per_position[pos] + 1):
                s = model.core_step(s, e, rope, step, cache)
            out.append(model.coda(s, rope, cache)[0][0, -1])
    return torch.stack(out)


def test_physical_slots_follow_the_modulo_rule(model):
    cfg = model.config
    l_P, l_R = cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block
    for budget in (1, 3, 4, l_R * STEPS):
        cache = KVCache(cfg, 1, 8, STEPS, budget)
        assert [cache.physical(i) for i in range(l_P)] == list(range(l_P))
        for c in range(l_P, l_P + l_R * STEPS):
            assert cache.physical(c) == (c - l_P) % budget + l_P
        assert cache.physical(-1) == l_P + budget + cfg.n_layers_in_coda - 1
    with pytest.raises(IndexError):
        cache.physical(l_P + l_R * STEPS)
    with pytest.raises(ValueError, match="cache_budget"):
        KVCache(cfg, 1, 8, STEPS, 0)


def test_memory_is_proportional_to_slots(model):
    cfg = model.config
    l_P, l_R, l_C = (cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block,
                     cfg.n_layers_in_coda)  # fmt: skip
    full = KVCache(cfg, 2, 16, STEPS)
    per_slot = 2 * 2 * cfg.n_heads * 16 * cfg.head_dim * 4
    assert full.memory_bytes == (l_P + l_R * STEPS + l_C) * per_slot
    for budget in (2, 4):
        small = KVCache(cfg, 2, 16, STEPS, budget)
        assert small.memory_bytes == (l_P + budget + l_C) * per_slot
        assert small.memory_bytes < full.memory_bytes
    assert KVCache(cfg, 2, 16, STEPS, 10_000).memory_bytes == full.memory_bytes


@pytest.mark.parametrize("exit_criterion", [None, "latent-diff"])
def test_full_budget_equals_full_cache_bit_for_bit(model, exit_criterion):
    cfg = model.config
    ids = prompt(2, 5)
    kw = dict(num_steps=STEPS, init_scale=0.0, stop_tokens=(), return_details=True,
              output_scores=True)  # fmt: skip
    if exit_criterion:
        kw.update(exit_criterion=exit_criterion, exit_threshold=0.3)
    full = generate(model, ids, 8, **kw)
    for budget in (cfg.n_layers_in_recurrent_block * STEPS, 1000):
        shared = generate(model, ids, 8, cache_budget=budget, **kw)
        assert torch.equal(shared.sequences, full.sequences)
        assert torch.equal(shared.scores, full.scores)
        assert shared.cache_bytes == full.cache_bytes
    small = generate(model, ids, 8, cache_budget=2, **kw)
    assert small.cache_bytes < full.cache_bytes


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_shared_cache_matches_slow_reference(model, budget):
    l_P = model.config.n_layers_in_prelude

    def shared(index, pos, current):  # storage slot (c − l_P) mod N + l_P: later calls overwrite
        return (index if index < l_P else (index - l_P) % budget + l_P, pos)

    # a one-token prompt: every position is decoded alone, as in the token-by-token reference
    # (a parallel prefill reads same-iteration entries of its neighbours instead)
    ids = prompt(1, 1, seed=budget)
    T = ids.shape[1]
    out = generate(model, ids, 8, num_steps=STEPS, init_scale=0.0, stop_tokens=(),
                   cache_budget=budget, return_details=True, output_scores=True)  # fmt: skip
    ref = reference_decode(model, out.sequences, [STEPS] * out.sequences.shape[1], shared)
    torch.testing.assert_close(out.scores[0], ref[T - 1 : -1], rtol=1e-4, atol=1e-4)
    assert torch.equal(ref[T - 1 : -1].argmax(-1), out.sequences[0, T:])


@pytest.mark.parametrize("batch", [1, 2])
def test_mixed_depth_exits_match_latest_entry_reference(model, batch):
    cfg = model.config
    l_P, l_R = cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block
    ids = prompt(batch, 4, seed=1)
    T = ids.shape[1]
    out = generate(model, ids, 10, num_steps=STEPS, exit_criterion="latent-diff",
                   exit_threshold=0.3, init_scale=0.0, stop_tokens=(), return_details=True,
                   output_scores=True)  # fmt: skip
    assert len(set(out.steps.flatten().tolist())) > 1, (
        "the test needs tokens exiting at different depths"
    )
    for row in range(batch):
        seq = out.sequences[row : row + 1]
        # positions before the last prompt token run the full depth; then one per generated token
        steps = [STEPS] * (T - 1) + out.steps[row].tolist() + [STEPS]  # last: not decoded

        def latest(index, pos, current, steps=steps):
            if index < l_P or pos == current:
                return (index, pos)
            step, layer = divmod(index - l_P, l_R)
            step = min(step + 1, steps[pos])
            return (l_P + l_R * (step - 1) + layer, pos)

        ref = reference_decode(model, seq, steps, latest)
        torch.testing.assert_close(out.scores[row], ref[T - 1 : -1], rtol=1e-4, atol=1e-4)
        assert torch.equal(ref[T - 1 : -1].argmax(-1), seq[0, T:])
