"""The Huginn tokenizer wrapper (special tokens, chat template) and the config round trip."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

import recurrent_model as rm
from recurrent_model.tokenizer import SPECIAL_TOKENS, special_token_offset


def build_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A byte-level BPE with the Huginn specials placed at V − 32 …, as the spec lays them out."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 32,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(["the cat sat on the mat", "def f(x): return x + 1"] * 20, trainer)
    specials = list(SPECIAL_TOKENS) + [f"<|reserved_{i}|>" for i in range(32 - len(SPECIAL_TOKENS))]

    while tok.get_vocab_size() < special_token_offset(vocab_size):  # pad to the offset
        tok.add_tokens([f"<|filler_{tok.get_vocab_size()}|>"])
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    return tok


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> rm.HuginnTokenizer:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    build_tokenizer().save(str(path))
    return rm.HuginnTokenizer.from_file(path)


def test_special_token_ids_follow_the_published_layout(tokenizer):
    offset = special_token_offset(320)
    assert (tokenizer.bos_id, tokenizer.eos_id) == (offset, offset + 1)
    assert tokenizer.begin_header_id == offset + 2 and tokenizer.end_header_id == offset + 3
    assert tokenizer.end_turn_id == offset + 4 and tokenizer.pad_id == offset + 5
    assert tokenizer.stop_ids == (offset, offset + 1, offset + 4)
    assert special_token_offset(65536) == 65504


def test_encode_decode_round_trip(tokenizer):
    text = "def f(x): return x + 1"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_id
    assert tokenizer.decode(ids[1:]) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert "".join(tokenizer.token_strings(ids[1:])) == text


def test_chat_template_matches_the_published_format(tokenizer):
    messages = [
        {"role": "system", "content": "  Be brief. "},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "And 4+4?"},
    ]
    text = tokenizer.apply_chat_template(messages)
    assert text == (
        "<|begin_text|>"
        "<|begin_header|>system<|end_header|>\n\nBe brief.<|end_turn|>"
        "<|begin_header|>user<|end_header|>\n\nWhat is 2+3?<|end_turn|>"
        "<|begin_header|>Huginn<|end_header|>\n\n5<|end_turn|>"
        "<|begin_header|>user<|end_header|>\n\nAnd 4+4?<|end_turn|>"
        "<|begin_header|>Huginn<|end_header|>\n\n"
    )
    ids = tokenizer.encode_chat(messages)
    assert ids.count(tokenizer.bos_id) == 1 and ids[0] == tokenizer.bos_id
    assert ids.count(tokenizer.end_turn_id) == 4
    with pytest.raises(rm.TokenizerError, match="'role' and 'content'"):
        tokenizer.apply_chat_template([{"text": "hi"}])


def test_tokenizer_errors(tmp_path):
    with pytest.raises(rm.TokenizerError, match="no tokenizer file"):
        rm.HuginnTokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(rm.TokenizerError, match="not a valid tokenizer.json"):
        rm.HuginnTokenizer.from_file(tmp_path / "bad.json")
    plain = Tokenizer(models.BPE())
    with pytest.raises(rm.TokenizerError, match="lacks the Huginn special token"):
        rm.HuginnTokenizer(plain)


def test_checkpoint_carries_its_tokenizer(tokenizer, tmp_path):
    model = rm.RecurrentLM(rm.preset("tiny", vocab_size=320))
    model.tokenizer = tokenizer
    model.save_pretrained(tmp_path / "ck")
    loaded = rm.load_model(tmp_path / "ck")
    assert loaded.tokenizer.encode("the cat") == tokenizer.encode("the cat")
    ids = torch.tensor([loaded.tokenizer.encode("the cat")])
    assert loaded(ids, num_steps=2).logits.shape == (1, ids.shape[1], 320)


def test_config_round_trip_keeps_every_huginn_field(tmp_path):
    cfg = rm.preset("huginn-0125")
    cfg.to_json(tmp_path / "config.json")
    data = json.loads((tmp_path / "config.json").read_text())
    for key, value in {
        "model_type": "huginn_raven",
        "n_embd": 5280,
        "n_heads": 55,
        "num_attention_heads": 55,
        "num_key_value_heads": 55,
        "n_layers": 8,
        "n_layers_in_prelude": 2,
        "n_layers_in_recurrent_block": 4,
        "n_layers_in_coda": 2,
        "intermediate_size": 17920,
        "vocab_size": 65536,
        "block_size": 4096,
        "norm_eps": 1e-6,
        "rope_base": 50000.0,
        "mean_recurrence": 32,
        "mean_backprop_depth": 8,
        "injection_type": "linear",
        "sampling_scheme": "poisson-lognormal-filling",
        "state_init": "like-init",
        "init_strategy": "takase",
        "qk_bias": True,
        "bias": False,
        "tie_embeddings": True,
    }.items():
        assert data[key] == value, key
    again = rm.RecurrentConfig.from_json(tmp_path / "config.json")
    assert again.to_dict() == cfg.to_dict()
    with pytest.raises(rm.ConfigError, match="unknown preset"):
        rm.preset("gpt2")


def test_preset_takes_a_name_override():
    cfg = rm.preset("huginn-0125", name="my-huginn", mean_recurrence=16)
    assert (cfg.name, cfg.n_embd, cfg.mean_recurrence) == ("my-huginn", 5280, 16)
    assert rm.preset("tiny").name == "tiny"
    assert rm.preset("tiny", name="t").to_dict()["name"] == "t"
