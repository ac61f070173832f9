"""Named hooks: the exact name list, recording with run_with_cache, and interventions."""

from __future__ import annotations

import pytest
import torch

import recurrent_model as rm
from recurrent_model import hook_names

LAYER_HOOKS = ("hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")


@pytest.fixture(scope="module")
def ids(model) -> torch.Tensor:
    return torch.randint(
        0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1)
    )


def test_exact_ordered_hook_names_for_tiny_config(model):
    expected = (
        ["hook_embed"]
        + [f"prelude.0.{n}" for n in LAYER_HOOKS]
        + ["hook_e", "core.hook_state", "core.hook_adapter"]
        + [f"core.{j}.{n}" for j in range(2) for n in LAYER_HOOKS]
        + ["hook_latent"]
        + [f"coda.0.{n}" for n in LAYER_HOOKS]
        + ["hook_final_norm", "hook_logits"]
    )
    assert model.hook_names() == expected
    assert model.hook_names() == hook_names.declared(1, 2, 1)


def test_building_a_model_checks_its_hooks_against_hook_names(monkeypatch):
    """The model's hook points are built from hook_names and checked against its declared list."""
    names = hook_names.declared(1, 2, 1)
    swapped = [names[1], names[0], *names[2:]]
    with pytest.raises(ValueError, match="another order, first at position 0"):
        hook_names.check_created(swapped, 1, 2, 1)
    with pytest.raises(ValueError, match="a duplicate"):
        hook_names.check_created([*names, names[-1]], 1, 2, 1)
    declared = hook_names.declared
    monkeypatch.setattr(hook_names, "declared", lambda *n: declared(*n)[:-1] + ["hook_out"])
    with pytest.raises(
        ValueError, match=r"not declared: \['hook_logits'\].*not created: \['hook_out'\]"
    ):
        rm.RecurrentLM(rm.preset("tiny"), init_weights=False)


def test_run_with_cache_records_every_state_including_s0(model, ids):
    s0 = torch.randn(2, 6, model.config.n_embd)
    out, cache = model.run_with_cache(ids, num_steps=5, init_state=s0)
    states = cache[hook_names.STATE]
    assert states.shape == (6, 2, 6, model.config.n_embd)
    assert torch.equal(states[0], s0)
    assert torch.equal(states[-1], out.state)
    # s_i is the output of the last core layer at iteration i
    assert torch.equal(cache[hook_names.core(1)], states[1:])
    assert cache[hook_names.core(0, "hook_attn_out")].shape == (5, 2, 6, model.config.n_embd)
    assert torch.equal(cache[hook_names.LATENT], out.latents)
    assert set(cache) == set(model.hook_names())
    plain = model(ids, num_steps=5, init_state=s0)
    assert torch.equal(plain.logits, out.logits)


def test_names_filter_device_and_dtype(model, ids):
    _, only = model.run_with_cache(ids, num_steps=3, names_filter=hook_names.STATE)
    assert list(only) == [hook_names.STATE]
    _, some = model.run_with_cache(ids, 3, names_filter=lambda n: n.startswith("coda."))
    assert all(n.startswith("coda.") for n in some) and len(some) == 4
    _, small = model.run_with_cache(
        ids, 3, names_filter=[hook_names.STATE], cache_device="cpu", cache_dtype=torch.float16
    )
    assert small[hook_names.STATE].dtype == torch.float16
    with pytest.raises(KeyError, match="was not recorded"):
        only[hook_names.E]


def test_hook_steps_are_reported(model, ids):
    seen = []
    hooks = [
        (hook_names.STATE, lambda x, hook: seen.append((hook.name, hook.step))),
        (hook_names.core(0), lambda x, hook: seen.append((hook.name, hook.step))),
        (hook_names.E, lambda x, hook: seen.append((hook.name, hook.step))),
    ]
    with model.hooks(hooks):
        model(ids, num_steps=2)
    assert seen == [
        (hook_names.E, None),
        (hook_names.STATE, 0),
        (hook_names.core(0), 1),
        (hook_names.STATE, 1),
        (hook_names.core(0), 2),
        (hook_names.STATE, 2),
    ]


def test_patching_a_state_replaces_it_for_later_iterations(model, ids):
    s0 = torch.zeros(2, 6, model.config.n_embd)
    _, clean = model.run_with_cache(ids, num_steps=4, init_state=s0)
    donor = torch.randn_like(s0)

    def patch(x, hook):
        return donor if hook.step == 2 else None

    with model.hooks([(hook_names.STATE, patch)]):
        _, patched = model.run_with_cache(ids, num_steps=4, init_state=s0)
    states = patched[hook_names.STATE]
    assert torch.equal(states[:2], clean[hook_names.STATE][:2])
    assert torch.equal(states[2], donor)
    # s_3 is computed from the patched s_2: rerunning one step from the donor reproduces it
    e = patched[hook_names.E]
    rope = model.rope_at(0, 6)
    torch.testing.assert_close(model.core_step(donor, e, rope, 3).detach(), states[3])


def test_zero_ablation_and_steering_change_outputs(model, ids):
    base = model(ids, num_steps=3, init_scale=0.0).logits
    with model.hooks([(lambda n: n.endswith("hook_mlp_out"), lambda x, hook: torch.zeros_like(x))]):
        ablated = model(ids, num_steps=3, init_scale=0.0).logits
    with model.hooks([(hook_names.E, lambda x, hook: x * 1.5)]):
        steered = model(ids, num_steps=3, init_scale=0.0).logits
    assert not torch.allclose(base, ablated) and not torch.allclose(base, steered)
    assert torch.equal(model(ids, num_steps=3, init_scale=0.0).logits, base)  # hooks gone


def test_hooks_removed_on_exception(model, ids):
    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks([(hook_names.EMBED, lambda x, hook: None)]):
            raise RuntimeError("boom")
    assert all(not model.hook_point(n).fns for n in model.hook_names())

    def broken(x, hook):
        raise ValueError("inside hook")

    with pytest.raises(ValueError, match="inside hook"):
        with model.hooks([(hook_names.STATE, broken)]):
            model(ids, num_steps=1)
    assert not model.hook_point(hook_names.STATE).fns


def test_bad_hook_name_and_bad_replacement_are_clear_errors(model, ids):
    with pytest.raises(rm.HookError, match="no hook named 'core.hook_stat'"):
        with model.hooks([("core.hook_stat", lambda x, hook: None)]):
            pass
    with pytest.raises(rm.HookError, match="shape"):
        with model.hooks([(hook_names.E, lambda x, hook: x[:, :1])]):
            model(ids, num_steps=1)


def test_a_filter_that_matches_nothing_is_an_error_naming_the_closest_hooks(model, ids):
    with pytest.raises(rm.HookError, match="closest: 'core.hook_state'"):
        with model.hooks([("core.hook_stat", lambda x, hook: None)]):
            pass
    with pytest.raises(rm.HookError, match="matches no hook point; closest names: 'hook_embed'"):
        with model.hooks([(lambda n: n.startswith("core.7."), lambda x, hook: None)]):
            pass
    assert not model.has_hooks()

    def core_attn_output(name: str) -> bool:
        return name == "core.0.attn_out"

    with pytest.raises(rm.HookError, match="core_attn_output matches no hook point.*'core.0."):
        model.run_with_cache(ids, 1, names_filter=core_attn_output)
    with pytest.raises(rm.HookError, match="no hook named 'core.hook_latent'; closest:"):
        model.run_with_cache(ids, 1, names_filter=[hook_names.STATE, "core.hook_latent"])
    with pytest.raises(rm.HookError, match="empty"):
        model.run_with_cache(ids, 1, names_filter=[])
