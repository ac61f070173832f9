"""Tokenizer training: special-token ids, byte-level round trip, digit splitting, chat template."""

import pytest

from pretrain.data.config import DataError
from pretrain.data.starter_corpus import render_chat
from pretrain.data.tokenizer_training import (
    ALL_SPECIALS,
    MAX_TOKEN_LENGTH,
    check_special_ids,
    train_tokenizer,
)
from recurrent_model.tokenizer import SPECIAL_TOKENS, HuginnTokenizer

VOCAB = 512
TEXTS = [
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n",
    "The quick brown fox jumps over the lazy dog. 1234 + 5678 = 6912.",
    "Question: What is 17 mod 5?\nAnswer: 17 = 5 * 3 + 2, so 17 mod 5 = 2.\n#### 2",
] * 40


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> HuginnTokenizer:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(TEXTS, VOCAB, path)
    return HuginnTokenizer.from_file(path)


def test_special_tokens_occupy_the_last_32_ids_in_order(tokenizer):
    assert tokenizer.vocab_size == VOCAB
    for i, token in enumerate(ALL_SPECIALS):
        assert tokenizer.backend.token_to_id(token) == VOCAB - 32 + i
    assert len(ALL_SPECIALS) == 32 and ALL_SPECIALS[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (480, 481, 485)
    assert tokenizer.stop_ids == (480, 481, 484)


def test_published_layout_for_65536(tmp_path):
    # The full recipe's vocabulary: 65504 BOS, 65505 EOS, ... 65509 pad, 65510 the first FIM token.
    tok = train_tokenizer(["hello world 123"] * 3, 65536, tmp_path / "t.json")
    ids = [tok.backend.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(65504, 65514))
    assert tok.stop_ids == (65504, 65505, 65508)


@pytest.mark.parametrize(
    "text",
    ["def f(x):\n\treturn x  # naïve ☃ 日本語\r\n", "   leading and trailing   \n\n\n", "a" * 100],
)
def test_byte_level_round_trip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_bos=False)) == text


def test_digits_are_single_tokens(tokenizer):
    ids = tokenizer.encode("x = 90210", add_bos=False)
    pieces = tokenizer.token_strings(ids)
    assert pieces[-5:] == ["9", "0", "2", "1", "0"]


def test_max_token_length(tokenizer):
    vocab = tokenizer.backend.get_vocab()
    learned = [t for t, i in vocab.items() if i < VOCAB - 32 and not t.startswith("<|unused")]
    assert max(map(len, learned)) <= MAX_TOKEN_LENGTH


def test_chat_documents_encode_like_the_chat_template(tokenizer):
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5"},
    ]
    expected = tokenizer.encode_chat(messages, add_generation_prompt=False)
    ids = [
        tokenizer.bos_id,
        *tokenizer.encode(render_chat("What is 2 + 3?", "2 + 3 = 5"), add_bos=False),
    ]
    assert ids == expected


def test_tiny_corpus_still_fills_the_vocabulary(tmp_path):
    tok = train_tokenizer(["abc abc"], 400, tmp_path / "t.json")
    assert tok.vocab_size == 400 and tok.bos_id == 368
    assert tok.decode(tok.encode("abc xyz", add_bos=False)) == "abc xyz"


def test_wrong_layout_is_rejected(tokenizer):
    with pytest.raises(DataError, match="expected vocab_size 1024"):
        check_special_ids(tokenizer.backend, 1024)


def test_empty_training_text_is_an_error(tmp_path):
    with pytest.raises(DataError, match="no text"):
        train_tokenizer(["", ""], 400, tmp_path / "t.json")
