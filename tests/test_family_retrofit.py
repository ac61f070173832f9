"""The retrofitted-recurrence family (recurrent_model/retrofit.py) against the published code's own
outputs (tests/data/retrofit, offline), its KV cache, its loader's refusals, and the registry.

Parity measure throughout: max |a − b| / max |b| over the whole tensor, in float32.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import REPO, relative_error
from safetensors.torch import load_file, save_file

import recurrent_model as rm
from recurrent_model import families, hook_names
from recurrent_model.config import ConfigError, ContextLengthError
from recurrent_model.llama_layers import SlotCache
from recurrent_model.retrofit import RetrofitConfig, RetrofitLM, claims
from recurrent_model.threads import single_thread

ORACLE = REPO / "tests" / "data" / "retrofit"
CHECKPOINT = ORACLE / "checkpoint"
WEIGHTS = "model.safetensors"
TOLERANCE = 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """A model this small runs fastest on one thread, most of all on busy cores."""
    with single_thread(True):
        yield


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(ORACLE / "reference.safetensors")


@pytest.fixture(scope="module")
def oracle_model() -> RetrofitLM:
    """The oracle checkpoint as ``rm.load_model`` gives it; tests must not change it."""
    return rm.load_model(CHECKPOINT)


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """A copy of the oracle checkpoint to break."""
    return Path(shutil.copytree(CHECKPOINT, tmp_path / "ck"))


def edit_weights(directory: Path, change) -> None:
    tensors = load_file(directory / WEIGHTS)
    change(tensors)
    save_file(tensors, directory / WEIGHTS)


def edit_config(directory: Path, change) -> None:
    raw = json.loads((directory / "config.json").read_text())
    change(raw)
    (directory / "config.json").write_text(json.dumps(raw))


# Parity with the published code ------------------------------------------------------------------
def test_the_oracle_loads_as_a_retrofitted_model(oracle_model):
    assert isinstance(oracle_model, RetrofitLM)
    assert oracle_model.family == "Retrofitted" and not oracle_model.training
    assert oracle_model.dtype == torch.float32 and oracle_model.tokenizer is None
    assert oracle_model.default_steps() == 32 and oracle_model.config.block_size == 64
    assert oracle_model.lm_head.weight is not oracle_model.transformer.wte.weight
    assert oracle_model.hook_names() == hook_names.declared(1, 2, 1)
    stored = load_file(CHECKPOINT / WEIGHTS)
    assert stored.keys() == oracle_model.state_dict().keys()


@pytest.mark.parametrize("r", [32, 1, 3])
def test_logits_and_every_state_match_the_published_forward(oracle_model, reference, r):
    """Given the oracle's s_0, the logits, s_0 … s_r, e and ln_f(coda(s_r)) equal the fork's."""
    names = [hook_names.STATE, hook_names.E, hook_names.FINAL_NORM]
    with torch.no_grad():
        out, cache = oracle_model.run_with_cache(
            reference["input_ids"], num_steps=r, init_state=reference["s0"], names_filter=names
        )
    errors = {
        "logits": relative_error(out.logits, reference[f"logits_r{r}"]),
        "states": relative_error(cache[hook_names.STATE], reference[f"states_r{r}"]),
        "prelude": relative_error(cache[hook_names.E], reference["prelude_output"]),
        "final_hidden": relative_error(
            cache[hook_names.FINAL_NORM], reference[f"final_hidden_r{r}"]
        ),
    }
    print(f"r={r} max relative errors: {errors}")
    assert out.logits.dtype == torch.float32
    assert cache[hook_names.STATE].shape == reference[f"states_r{r}"].shape
    assert all(e <= TOLERANCE for e in errors.values()), errors
    assert torch.equal(out.state, cache[hook_names.STATE][-1])
    assert torch.equal(out.latents, oracle_model.state_norm()(out.state))


def test_identity_adapter_at_one_step_is_the_source_llama(oracle_model, reference):
    """Adapter [0 | I] and r = 1 turn the model back into the Llama it was cut from."""
    model = copy.deepcopy(oracle_model)
    h = model.config.n_embd
    with torch.no_grad():
        model.transformer.adapter.weight.zero_()
        model.transformer.adapter.weight[:, h:] = torch.eye(h)
        logits = model(reference["input_ids"], 1, init_state=reference["s0"]).logits
    vs_fork = relative_error(logits, reference["identity_adapter_r1_logits"])
    vs_llama = relative_error(logits, reference["source_llama_logits"])
    print(f"[0|I] adapter, r=1: vs the fork {vs_fork:.2e}, vs the source Llama {vs_llama:.2e}")
    assert vs_fork <= TOLERANCE and vs_llama <= TOLERANCE


def test_the_random_initial_state_follows_the_published_rule(oracle_model, reference):
    """s_0 ~ TruncNormal(0, std², ±3 std), std = init_values.std; init_scale 0 gives zeros."""
    e = reference["prelude_output"]
    std = oracle_model.config.init_std
    s0 = oracle_model.initial_state(e, generator=torch.Generator().manual_seed(0))
    assert s0.abs().max() <= 3 * std and 0.8 * std < s0.std() < 1.2 * std
    assert torch.count_nonzero(oracle_model.initial_state(e, init_scale=0)) == 0


# The KV cache ------------------------------------------------------------------------------------
def test_a_slot_cache_fed_in_pieces_gives_the_uncached_logits(oracle_model, reference):
    """A 4-token prefill, a 3-token chunk, then single tokens: the logits of the whole sequence,
    and one cache slot per layer call (P + r·C + K)."""
    ids, s0, r = reference["input_ids"], reference["s0"], 3
    cache = SlotCache()
    pieces = []
    with torch.no_grad():
        full = oracle_model(ids, r, init_state=s0).logits
        for start, end in [(0, 4), (4, 7), (7, 8), (8, 9), (9, 10)]:
            out = oracle_model(
                ids[:, start:end], r, init_state=s0[:, start:end], cache=cache, start=start
            )
            pieces.append(out.logits)
    error = relative_error(torch.cat(pieces, dim=1), full)
    print(f"cached vs uncached, r={r}: max relative error {error:.2e}")
    assert error <= TOLERANCE
    assert sorted(cache.slots) == list(range(1 + r * 2 + 1))
    assert all(k.shape[2] == ids.shape[1] for k, _ in cache.slots.values())


# Saving and loading ------------------------------------------------------------------------------
def test_save_then_load_round_trips_bit_for_bit(oracle_model, reference, tmp_path):
    oracle_model.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["config.json", WEIGHTS]
    loaded = rm.load_model(tmp_path / "saved")
    assert isinstance(loaded, RetrofitLM)
    assert loaded.config.to_dict() == oracle_model.config.to_dict()
    for (k, a), (_, b) in zip(oracle_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    ids, s0 = reference["input_ids"], reference["s0"]
    with torch.no_grad():
        assert torch.equal(
            loaded(ids, 3, init_state=s0).logits, oracle_model(ids, 3, init_state=s0).logits
        )


def test_leftover_huginn_tensors_are_ignored(oracle_model, copied):
    """norm_3/norm_4 of every layer and freqs_cis, as Huginn's own code saves them, are skipped."""
    parts = ["prelude.0", "core_block.0", "core_block.1", "coda.0"]

    def add_leftovers(tensors):
        for part in parts:
            for norm in ("norm_3", "norm_4"):
                tensors[f"transformer.{part}.{norm}.weight"] = torch.ones(64)
        tensors["freqs_cis"] = torch.randn(64, 8, 2)

    edit_weights(copied, add_leftovers)
    loaded = rm.load_model(copied)
    assert loaded.state_dict().keys() == oracle_model.state_dict().keys()
    for (k, a), (_, b) in zip(oracle_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k


# Refusals: one line each, naming the problem -----------------------------------------------------
def drop(key):
    return lambda tensors: tensors.pop(key)


def reshape(key, shape):
    return lambda tensors: tensors.__setitem__(key, torch.zeros(shape))


WEIGHT_FAULTS = {
    "missing": (
        drop("transformer.coda.0.norm_2.weight"),
        r"missing tensor transformer\.coda\.0\.norm_2\.weight",
    ),
    "missing untied head": (drop("lm_head.weight"), r"missing tensor lm_head\.weight"),
    "misshapen": (
        reshape("transformer.adapter.weight", (64, 64)),
        r"tensor transformer\.adapter\.weight has shape \[64, 64\].*needs \[64, 128\]",
    ),
    "unexpected": (
        reshape("transformer.core_block.0.attn.qk_bias", (2, 1, 4, 16)),
        r"unexpected tensor transformer\.core_block\.0\.attn\.qk_bias",
    ),
    "leftover norm of a layer that does not exist": (
        reshape("transformer.core_block.2.norm_3.weight", (64,)),
        r"unexpected tensor transformer\.core_block\.2\.norm_3\.weight",
    ),
}


@pytest.mark.parametrize("fault", list(WEIGHT_FAULTS))
def test_a_broken_tensor_is_refused_by_name(copied, fault):
    change, message = WEIGHT_FAULTS[fault]
    edit_weights(copied, change)
    with pytest.raises(rm.CheckpointError, match=message) as caught:
        rm.load_model(copied)
    assert "\n" not in str(caught.value)


def test_a_truncated_weights_file_is_refused(copied):
    path = copied / WEIGHTS
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(rm.CheckpointError, match=r"model\.safetensors is not a readable"):
        rm.load_model(copied)


CONFIG_FAULTS = {
    "missing field": (
        lambda raw: raw.pop("rope_theta"),
        r"missing required field\(s\): rope_theta",
    ),
    "rope_scaling": (
        lambda raw: raw.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
        r"rope_scaling=.*does not implement",
    ),
    "adapter bias": (lambda raw: raw.update(bias=True), r"bias=True .*does not implement"),
    "qk bias": (lambda raw: raw.update(qk_bias=True), r"qk_bias=True .*does not implement"),
    "heads": (lambda raw: raw.update(n_heads=5), r"n_embd=64 is not divisible by n_heads=5"),
    "not a number": (lambda raw: raw.update(n_embd="64"), r"n_embd='64', not a number"),
    "grouping": (
        lambda raw: raw.update(num_key_value_heads=3),
        r"n_heads=4 is not divisible by num_key_value_heads=3",
    ),
}


@pytest.mark.parametrize("fault", list(CONFIG_FAULTS))
def test_a_config_this_forward_cannot_run_is_refused_by_field(copied, fault):
    change, message = CONFIG_FAULTS[fault]
    edit_config(copied, change)
    with pytest.raises(ConfigError, match=message) as caught:
        rm.load_model(copied)
    assert "\n" not in str(caught.value)


def test_bad_calls_are_refused(oracle_model, reference):
    ids = reference["input_ids"]
    with pytest.raises(ValueError, match="num_steps must be >= 0, got -1"):
        oracle_model(ids, -1)
    with pytest.raises(ValueError, match="num_steps must be an integer"):
        oracle_model(ids, 2.5)
    with pytest.raises(ContextLengthError, match="65 tokens exceeds the model's context of 64"):
        oracle_model(torch.zeros(1, 65, dtype=torch.long), 1)
    with pytest.raises(ContextLengthError, match="context of 64"):
        oracle_model(ids, 1, cache=SlotCache(), start=60)
    with pytest.raises(ValueError, match=r"init_state has shape \(2, 10, 32\)"):
        oracle_model(ids, 1, init_state=torch.zeros(2, 10, 32))


# The registry ------------------------------------------------------------------------------------
def test_the_registry_tells_the_two_huginn_raven_layouts_apart():
    oracle = json.loads((CHECKPOINT / "config.json").read_text())
    assert families.family_of(oracle).name == "Retrofitted"
    default = REPO / "checkpoints" / "default" / "config.json"
    if not default.is_file():
        pytest.skip("checkpoints/default is not present")
    assert families.family_of(json.loads(default.read_text())).name == "Huginn"


def test_the_claim_rule():
    """qk_bias false or a rope_theta field: retrofitted; Huginn's qk bias and rope_base: not."""
    assert claims({"qk_bias": False, "rope_base": 50000.0})
    assert claims({"qk_bias": True, "rope_theta": 10000.0})
    assert not claims({"qk_bias": True, "rope_base": 50000.0})
    assert not claims({"rope_base": 50000.0})


def test_the_config_writes_back_what_it_read():
    raw = json.loads((CHECKPOINT / "config.json").read_text())
    config = RetrofitConfig.from_dict(raw)
    assert (config.n_embd, config.head_dim, config.num_key_value_heads) == (64, 16, 2)
    assert (config.block_size, config.rope_theta, config.embed_scale) == (64, 10000.0, 1.0)
    written = config.to_dict()
    assert {k: v for k, v in written.items() if k != "name"} == raw
    assert RetrofitConfig.from_dict(written) == config
