"""The Llama -> retrofitted-recurrence conversion (pretrain/retrofit.py): it reproduces the fork's
own conversion of the oracle's source Llama (tests/data/retrofit/source -> checkpoint), with an
identity adapter it is the source Llama at r = 1, it copies every chosen layer bit for bit, it
refuses what it cannot convert in one line, and the result loads and runs.

Parity measure: max |a − b| / max |b| over the whole tensor, in float32.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import REPO, relative_error
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models
from torch import nn

import recurrent_model as rm
from pretrain import retrofit
from pretrain.retrofit import LayerChoice, convert, default_layers, parse_layers
from recurrent_model.config import ConfigError
from recurrent_model.retrofit import RetrofitLM
from recurrent_model.threads import single_thread
from recurrent_model.tokenizer import BEGIN_HEADER, BOS, END_HEADER, END_TURN, EOS, PAD

ORACLE = REPO / "tests" / "data" / "retrofit"
SOURCE, CHECKPOINT = ORACLE / "source", ORACLE / "checkpoint"
WEIGHTS = "model.safetensors"
ADAPTER = "transformer.adapter.weight"
TOLERANCE = 1e-5
#: The synthetic source: 8 layers, GQA, float32 unless a test asks otherwise.
SIZES = dict(hidden=16, heads=4, kv_heads=2, intermediate=24, vocab=40, layers=8)
LLAMA_LAYER = {  # Llama name -> shape, per layer, at SIZES
    "self_attn.q_proj": (16, 16),
    "self_attn.k_proj": (8, 16),
    "self_attn.v_proj": (8, 16),
    "self_attn.o_proj": (16, 16),
    "mlp.gate_proj": (24, 16),
    "mlp.up_proj": (24, 16),
    "mlp.down_proj": (16, 24),
    "input_layernorm": (16,),
    "post_attention_layernorm": (16,),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Models this small run fastest on one thread, most of all on busy cores."""
    with single_thread(True):
        yield


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(ORACLE / "reference.safetensors")


@pytest.fixture(scope="module")
def oracle_mapping() -> LayerChoice:
    """The layers the fork's conversion took (reference.json build.mapping_cfg)."""
    raw = json.loads((ORACLE / "reference.json").read_text())["build"]["mapping_cfg"]
    return LayerChoice(*(tuple(raw[k]) for k in ("prelude_idx", "core_idx", "coda_idx")))


# A synthetic Hugging Face Llama ------------------------------------------------------------------
def llama_tensors(
    tied: bool = False, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Random weights in LlamaForCausalLM's names (norms near 1), seeded."""
    g = torch.Generator().manual_seed(0)
    h, vocab = SIZES["hidden"], SIZES["vocab"]

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        values = torch.randn(shape, generator=g)
        return (1 + 0.1 * values if len(shape) == 1 else 0.2 * values).to(dtype)

    tensors = {"model.embed_tokens.weight": draw((vocab, h)), "model.norm.weight": draw((h,))}
    if not tied:
        tensors["lm_head.weight"] = draw((vocab, h))
    for i in range(SIZES["layers"]):
        tensors |= {f"model.layers.{i}.{k}.weight": draw(s) for k, s in LLAMA_LAYER.items()}
    return tensors


def write_llama(
    directory: Path,
    tensors: dict[str, torch.Tensor] | None = None,
    shards: int = 1,
    **config: object,
) -> dict[str, torch.Tensor]:
    """A Hugging Face Llama directory (config.json + model.safetensors, or ``shards`` files and
    their index) holding ``tensors`` (default: :func:`llama_tensors`); ``config`` sets fields."""
    tensors = llama_tensors() if tensors is None else tensors
    directory.mkdir(parents=True)
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": SIZES["hidden"],
        "num_attention_heads": SIZES["heads"],
        "num_key_value_heads": SIZES["kv_heads"],
        "intermediate_size": SIZES["intermediate"],
        "vocab_size": SIZES["vocab"],
        "num_hidden_layers": SIZES["layers"],
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "torch_dtype": "float32",
        **config,
    }
    (directory / "config.json").write_text(json.dumps(raw))
    if shards == 1:
        save_file(tensors, directory / WEIGHTS, metadata={"format": "pt"})
        return tensors
    names, weight_map = sorted(tensors), {}
    for n in range(shards):
        shard = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[n::shards]}
        save_file(part, directory / shard, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


def write_tokenizer(path: Path, specials: tuple[str, ...]) -> None:
    """A word-level tokenizer.json of SIZES["vocab"] ids whose first ids are ``specials``."""
    words = [*specials, *(f"w{i}" for i in range(SIZES["vocab"] - len(specials)))]
    vocab = {word: i for i, word in enumerate(words)}
    Tokenizer(models.WordLevel(vocab, unk_token=words[-1])).save(str(path))


def expected_tensors(
    source: dict[str, torch.Tensor], choice: LayerChoice
) -> dict[str, torch.Tensor]:
    """What the fork's weight_mapping makes of ``source`` (everything but the adapter)."""
    head = source.get("lm_head.weight", source["model.embed_tokens.weight"])
    out = {
        "transformer.wte.weight": source["model.embed_tokens.weight"],
        "transformer.ln_f.weight": source["model.norm.weight"],
        "lm_head.weight": head,
    }
    for part, layers in zip(("prelude", "core_block", "coda"), choice, strict=True):
        for j, i in enumerate(layers):
            layer, to = f"model.layers.{i}", f"transformer.{part}.{j}"
            attn = [source[f"{layer}.self_attn.{x}_proj.weight"] for x in "qkv"]
            mlp = [source[f"{layer}.mlp.{x}_proj.weight"] for x in ("gate", "up")]
            out[f"{to}.attn.Wqkv.weight"] = torch.cat(attn)
            out[f"{to}.attn.proj.weight"] = source[f"{layer}.self_attn.o_proj.weight"]
            out[f"{to}.mlp.fc.weight"] = torch.cat(mlp)
            out[f"{to}.mlp.proj.weight"] = source[f"{layer}.mlp.down_proj.weight"]
            out[f"{to}.norm_1.weight"] = source[f"{layer}.input_layernorm.weight"]
            out[f"{to}.norm_2.weight"] = source[f"{layer}.post_attention_layernorm.weight"]
    return out


def assert_bit_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype, key
        assert torch.equal(got[key], tensor), key


# (a) The published conversion --------------------------------------------------------------------
@pytest.mark.parametrize("explicit", [True, False], ids=["oracle-layers", "default-layers"])
def test_reproduces_the_published_conversion_except_the_random_adapter(
    tmp_path, oracle_mapping, explicit
):
    """Every tensor of the fork's conversion of the same source, bit for bit, but the adapter:
    the fork leaves it at a random nn.Linear init drawn from the global RNG, which no one can
    replay. The default rule picks the oracle's layers (0 | 1, 2 | 3) on its 4-layer source."""
    layers = [list(part) for part in oracle_mapping] if explicit else None
    out = convert(SOURCE, tmp_path / "out", 1, 2, 1, layers=layers, adapter="published")
    got, fork = load_file(out / WEIGHTS), load_file(CHECKPOINT / WEIGHTS)
    assert got.pop(ADAPTER).shape == fork.pop(ADAPTER).shape
    assert_bit_identical(got, fork)


def test_the_config_is_the_forks_field_by_field(tmp_path):
    """Equal to the fork's config.json but for the documented differences: rope_base repeats
    rope_theta, no transformers_version, and a name and the conversion's provenance added."""
    out = convert(SOURCE, tmp_path / "out", 1, 2, 1)
    ours = json.loads((out / "config.json").read_text())
    fork = json.loads((CHECKPOINT / "config.json").read_text())
    assert ours.pop("rope_base") == ours["rope_theta"] == 10000.0
    assert fork.pop("rope_base") == 500000.0
    fork.pop("transformers_version")
    assert ours.pop("name") == "out"
    provenance = ours.pop("retrofit_conversion")
    assert ours == fork
    assert provenance["prelude_idx"] == [0] and provenance["core_idx"] == [1, 2]
    assert provenance["coda_idx"] == [3] and provenance["adapter"] == "published"


def test_the_published_adapter_is_nn_linears_init_drawn_from_the_seed(tmp_path):
    """What torch.nn.Linear(2h, h) draws after torch.manual_seed(seed): U(±1/sqrt(2h)), the law
    of the fork's adapter too (8192 draws reach within 1% of the bound)."""
    first = load_file(convert(SOURCE, tmp_path / "a", 1, 2, 1, seed=3) / WEIGHTS)[ADAPTER]
    again = load_file(convert(SOURCE, tmp_path / "b", 1, 2, 1, seed=3) / WEIGHTS)[ADAPTER]
    other = load_file(convert(SOURCE, tmp_path / "c", 1, 2, 1, seed=4) / WEIGHTS)[ADAPTER]
    with torch.random.fork_rng():
        torch.manual_seed(3)
        linear = nn.Linear(128, 64, bias=False).weight.detach()
    assert torch.equal(first, again) and torch.equal(first, linear)
    assert not torch.equal(first, other)
    bound, fork = 1 / math.sqrt(128), load_file(CHECKPOINT / WEIGHTS)[ADAPTER]
    assert first.abs().max() <= bound
    assert 0.99 * bound < fork.abs().max() <= bound  # the fork's own draw: the same law


# (b) The identity adapter ------------------------------------------------------------------------
def test_identity_adapter_at_one_step_is_the_source_llama_for_any_initial_state(
    tmp_path, reference
):
    """[0 | I] and r = 1 give the logits transformers' LlamaForCausalLM computed for the source
    (reference.json: layers 0..3, the oracle's prelude, core and coda), whatever s_0."""
    model = rm.load_model(convert(SOURCE, tmp_path / "out", 1, 2, 1, adapter="identity"))
    ids, want = reference["input_ids"], reference["source_llama_logits"]
    g = torch.Generator().manual_seed(0)
    starts = [reference["s0"], torch.zeros_like(reference["s0"]),
              10 * torch.randn(reference["s0"].shape, generator=g)]  # fmt: skip
    with torch.no_grad():
        errors = [relative_error(model(ids, 1, init_state=s0).logits, want) for s0 in starts]
        errors.append(relative_error(model(ids, 1).logits, want))  # a random s_0
    print(f"[0|I] adapter, r=1 vs the source Llama: {errors}")
    assert max(errors) <= TOLERANCE


# (c) The layers, bit for bit ---------------------------------------------------------------------
def test_default_layers_follow_the_forks_settings():
    """TinyLlama 4-8-4 (convert_llama.py main) and OLMo-2-1B 7-4-5 (convert_olmo.sh)."""
    tinyllama = default_layers(22, 4, 8, 4)
    assert tinyllama == ((0, 1, 2, 3), tuple(range(10, 18)), (18, 19, 20, 21))
    assert default_layers(16, 7, 4, 5) == (tuple(range(7)), (7, 8, 9, 10), tuple(range(11, 16)))
    assert default_layers(4, 0, 4, 0) == ((), (0, 1, 2, 3), ())


def test_parse_layers_reads_lists_and_ranges():
    assert parse_layers("0,1,2:10,11:20,21") == ((0, 1, 2), (10, 11), (20, 21))
    assert parse_layers("0-3:10-17:18-21") == default_layers(22, 4, 8, 4)
    assert parse_layers(":2-4:") == ((), (2, 3, 4), ())


def test_every_chosen_layer_is_copied_bit_for_bit_by_default(tmp_path):
    """8 source layers, prelude 2, core 3, coda 2: layers 0-1 | 3-5 | 6-7 (layer 2 dropped)."""
    source = write_llama(tmp_path / "llama")
    out = convert(tmp_path / "llama", tmp_path / "out", 2, 3, 2)
    got = load_file(out / WEIGHTS)
    got.pop(ADAPTER)
    assert_bit_identical(got, expected_tensors(source, default_layers(8, 2, 3, 2)))


def test_chosen_layers_from_a_sharded_bf16_source_via_the_cli(tmp_path):
    """--layers in any order from index + shards; the source's dtype is kept, the adapter too."""
    source = write_llama(tmp_path / "llama", llama_tensors(dtype=torch.bfloat16), shards=3)
    args = ["--from", str(tmp_path / "llama"), "--out", str(tmp_path / "out")]
    out = retrofit.main([*args, "--layers", "5,1:0,2-3:7", "--adapter", "identity"])
    got = load_file(out / WEIGHTS)
    adapter = got.pop(ADAPTER)
    assert adapter.dtype == torch.bfloat16 and torch.equal(
        adapter[:, 16:], torch.eye(16).bfloat16()
    )
    assert_bit_identical(got, expected_tensors(source, parse_layers("5,1:0,2-3:7")))
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_a_tied_source_gets_an_untied_copy_of_its_embedding_as_head(tmp_path):
    """As the fork writes it: tie_embeddings false, lm_head = the embedding's values."""
    source = write_llama(tmp_path / "llama", llama_tensors(tied=True))
    out = convert(tmp_path / "llama", tmp_path / "out", 2, 3, 2)
    got = load_file(out / WEIGHTS)
    assert torch.equal(got["lm_head.weight"], source["model.embed_tokens.weight"])
    assert json.loads((out / "config.json").read_text())["tie_embeddings"] is False


def test_the_tokenizer_is_copied_where_load_model_takes_it(tmp_path):
    """Beside the weights when load_model accepts it: Huginn's (its special tokens) or the source's
    own (a Llama's, with its BOS and EOS ids); else, unchanged, in source_tokenizer/ with a
    warning, so that the result still loads."""
    write_llama(tmp_path / "ok")
    write_tokenizer(tmp_path / "ok" / "tokenizer.json", (BOS, EOS, BEGIN_HEADER, END_HEADER,
                                                         END_TURN, PAD))  # fmt: skip
    out = convert(tmp_path / "ok", tmp_path / "out-ok", 2, 3, 2)
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "ok/tokenizer.json").read_bytes()
    assert rm.load_model(out, require_tokenizer=True).tokenizer.vocab_size == SIZES["vocab"]
    config = json.loads((out / "config.json").read_text())
    assert config["retrofit_conversion"]["tokenizer"] == "tokenizer.json"

    write_llama(tmp_path / "plain")
    write_tokenizer(tmp_path / "plain" / "tokenizer.json", ("<s>", "</s>"))
    out = convert(tmp_path / "plain", tmp_path / "out-plain", 2, 3, 2)
    tokenizer = rm.load_model(out, require_tokenizer=True).tokenizer
    assert (
        type(tokenizer).__name__ == "PretrainedTokenizer" and tokenizer.vocab_size == SIZES["vocab"]
    )

    write_llama(tmp_path / "big")
    path = tmp_path / "big" / "tokenizer.json"
    words = {f"w{i}": i for i in range(SIZES["vocab"] + 5)}  # more ids than the embedding holds
    Tokenizer(models.WordLevel(words, unk_token="w0")).save(str(path))
    with pytest.warns(UserWarning, match="source_tokenizer"):
        out = convert(tmp_path / "big", tmp_path / "out-big", 2, 3, 2)
    assert not (out / "tokenizer.json").exists()
    assert (out / "source_tokenizer" / "tokenizer.json").read_bytes() == path.read_bytes()
    assert rm.load_model(out).tokenizer is None
    config = json.loads((out / "config.json").read_text())
    assert config["retrofit_conversion"]["tokenizer"].startswith("source_tokenizer/")


# (d) Refusals ------------------------------------------------------------------------------------
def drop(name: str):
    return lambda tensors: tensors.pop(name)


REFUSALS = {  # case -> (config changes, tensor change, prelude/core/coda, layers, message)
    "not-llama": ({"model_type": "olmo2"}, None, (2, 3, 2), None, "not 'llama'"),
    "no-q_proj": ({}, drop("model.layers.3.self_attn.q_proj.weight"), (2, 3, 2), None,
                  "not a Llama layout: it lacks model.layers.3.self_attn.q_proj"),
    "no-gate_proj": ({}, drop("model.layers.0.mlp.gate_proj.weight"), (2, 3, 2), None,
                     "not a Llama layout: it lacks model.layers.0.mlp.gate_proj"),
    "too-many-layers": ({}, None, (4, 4, 2), None, "has 8 layers, but prelude"),
    "overlap": ({}, None, (1, 2, 1), "0:0,1:2", r"layer\(s\) \[0\] more than once"),
    "out-of-range": ({}, None, (1, 2, 1), "0:1,8:2", r"names layer\(s\) \[8\]"),
    "counts-differ": ({}, None, (1, 2, 1), "0:1-3:4", "gives 1, 3, 1 layers"),
    "bad-syntax": ({}, None, (1, 2, 1), "0-3:4", "must be PRELUDE:CORE:CODA"),
    "no-core": ({}, None, (1, 0, 1), None, "must be >= 0, >= 1 and >= 0"),
    "rope-scaling": ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None, (2, 3, 2),
                     None, "rope_scaling"),
    "bias": ({"attention_bias": True}, None, (2, 3, 2), None, "attention_bias"),
    "activation": ({"hidden_act": "gelu"}, None, (2, 3, 2), None, "hidden_act"),
    "shape": ({"intermediate_size": 32}, None, (2, 3, 2), None, "does not match its config"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_and_write_nothing(tmp_path, case):
    changes, change_tensors, counts, layers, message = REFUSALS[case]
    tensors = llama_tensors()
    if change_tensors is not None:
        change_tensors(tensors)
    write_llama(tmp_path / "llama", tensors, **changes)
    with pytest.raises(ValueError, match=message) as caught:
        convert(tmp_path / "llama", tmp_path / "out", *counts, layers=layers)
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]


def test_a_non_llama_source_is_a_config_error(tmp_path):
    write_llama(tmp_path / "llama", model_type="olmo2")
    with pytest.raises(ConfigError):
        convert(tmp_path / "llama", tmp_path / "out", 2, 3, 2)


def test_an_existing_out_is_never_overwritten(tmp_path):
    write_llama(tmp_path / "llama")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists"):
        convert(tmp_path / "llama", tmp_path / "out", 2, 3, 2)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prelude", "4", "--core", "4", "--coda", "2"], "has 8 layers"),
        (["--prelude", "1"], "give --prelude, --core and --coda, or --layers"),
        (["--layers", "0:1,1:2"], "more than once"),
    ],
)
def test_the_cli_refuses_in_one_line(tmp_path, extra, message):
    write_llama(tmp_path / "llama")
    with pytest.raises(SystemExit) as caught:
        retrofit.main(["--from", str(tmp_path / "llama"), "--out", str(tmp_path / "out"), *extra])
    text = str(caught.value.code)
    assert text.startswith("error: ") and message in text and "\n" not in text


def test_pickle_weights_and_missing_sources_are_refused(tmp_path):
    write_llama(tmp_path / "llama")
    (tmp_path / "llama" / WEIGHTS).rename(tmp_path / "llama" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="never unpickles"):
        convert(tmp_path / "llama", tmp_path / "out", 2, 3, 2)
    with pytest.raises(ValueError, match="does not exist"):
        convert(tmp_path / "absent", tmp_path / "out", 2, 3, 2)


def test_a_hub_id_is_fetched_as_load_model_fetches_one(tmp_path, monkeypatch):
    """A hub id goes through recurrent_model.hub; offline and uncached, the refusal names it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="hub id 'someone/tiny-llama' is not in the hub cache"):
        convert("someone/tiny-llama", tmp_path / "out", 2, 3, 2)


# (e) The result loads and runs -------------------------------------------------------------------
def test_the_result_loads_and_runs_at_several_depths(tmp_path):
    write_llama(tmp_path / "llama")
    out = convert(tmp_path / "llama", tmp_path / "out", 2, 3, 2)
    model = rm.load_model(out)
    assert isinstance(model, RetrofitLM) and model.family == "Retrofitted"
    assert model.config.shape_summary().startswith("(2, 3, 2) h=16 heads=4/2 kv")
    ids = torch.randint(0, SIZES["vocab"], (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for r in (1, 4, 16):
            out_r = model(ids, num_steps=r)
            assert out_r.logits.shape == (2, 7, SIZES["vocab"]) and out_r.num_steps == r
            assert torch.isfinite(out_r.logits).all()
