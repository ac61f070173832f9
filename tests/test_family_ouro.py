"""The Ouro family: parity with the published modeling code (offline, from tests/data/ouro/, made by
its regenerate.py), the learned exit, cached generation, and the loader's fault table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import relative_error
from safetensors.torch import load_file, save_file

import recurrent_model as rm
from recurrent_model.checkpoint import CheckpointError
from recurrent_model.config import ConfigError, ContextLengthError
from recurrent_model.families import family_of
from recurrent_model.ouro import OuroLM, exit_steps

DATA = Path(__file__).resolve().parent / "data" / "ouro"
CHECKPOINT = DATA / "checkpoint"
DEPTHS = (4, 2, 6)  # total_ut_steps, then two other depths


@pytest.fixture(scope="module")
def ouro() -> OuroLM:
    return rm.load_model(CHECKPOINT)


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(DATA / "reference.safetensors")


@pytest.mark.parametrize("r", DEPTHS)
def test_logits_states_and_exit_equal_the_published_code(ouro, reference, r):
    ids = reference["input_ids"]
    with torch.no_grad():
        out, cache = ouro.run_with_cache(ids, num_steps=r,
                                         names_filter=["core.hook_state", "core.hook_exit_gate"])  # fmt: skip
        chosen = ouro(ids, num_steps=r, exit_threshold=0.5)
    errors = {
        "logits": relative_error(out.logits, reference[f"r{r}.logits"]),
        "states": relative_error(cache["core.hook_state"], reference[f"r{r}.states"]),
        "gate": relative_error(cache["core.hook_exit_gate"], reference[f"r{r}.gate"]),
        "exit_pdf": relative_error(out.exit_pdf, reference[f"r{r}.exit_pdf"]),
        "logits at exit 0.5": relative_error(chosen.logits, reference[f"r{r}.logits_thr0p5"]),
    }
    print(f"r={r}: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert max(errors.values()) < 1e-5
    steps = exit_steps(out.exit_pdf, 0.5)
    assert torch.equal(steps, reference[f"r{r}.exit_step_thr0p5"])
    assert out.exit_pdf.shape == (*ids.shape, r)
    torch.testing.assert_close(out.exit_pdf.sum(-1), torch.ones(ids.shape), atol=1e-6, rtol=0)


def test_every_loop_logits_equal_the_published_exit_at_step(ouro, reference):
    ids = reference["input_ids"]
    with torch.no_grad():
        _, cache = ouro.run_with_cache(ids, num_steps=4, names_filter="core.hook_state")
        loops = ouro.coda(cache["core.hook_state"][1:])[0]
    assert relative_error(loops, reference["r4.loop_logits"]) < 1e-5


def test_cached_generation_gives_the_uncached_tokens_past_the_sliding_window(ouro, reference):
    prompt = reference["input_ids"][:, :5]  # 5 + 4 tokens: past the window of 6
    with torch.no_grad():
        fixed = ouro.generate(prompt, 4, return_details=True, stop_tokens=())
        full = ouro(fixed.sequences[:, :-1])
        gated = ouro.generate(prompt, 4, return_details=True, stop_tokens=(),
                              exit_criterion="exit-gate", exit_threshold=0.5)  # fmt: skip
        at_exit = ouro(gated.sequences[:, :-1], exit_threshold=0.5)
    assert torch.equal(full.logits[:, 4:].argmax(-1), fixed.sequences[:, 5:])
    assert (fixed.exit_steps == 4).all()
    assert torch.equal(at_exit.logits[:, 4:].argmax(-1), gated.sequences[:, 5:])
    expected = exit_steps(at_exit.exit_pdf[:, 4:], 0.5) + 1
    assert torch.equal(gated.exit_steps, expected) and (expected < 4).any()


def test_the_exit_gate_is_refused_for_a_model_without_one(model):
    with pytest.raises(ValueError, match="learned exit gate"):
        model.generate(torch.tensor([[1, 2]]), 1, exit_criterion="exit-gate")


def test_hooks_replace_a_loop_state(ouro, reference):
    ids = reference["input_ids"]
    with torch.no_grad():
        plain = ouro(ids).logits
        with ouro.hooks([("core.hook_state", lambda x, hook: x * 0 if hook.step == 2 else None)]):
            patched = ouro(ids).logits
    assert not torch.allclose(plain, patched)
    names = ouro.hook_names()
    assert names[:2] == ["hook_embed", "core.hook_state"] and names[-1] == "hook_logits"
    assert "core.1.hook_resid_post" in names and "core.hook_exit_gate" in names


def test_seeds_do_not_change_the_deterministic_start(ouro, reference):
    ids = reference["input_ids"]
    with torch.no_grad():
        a = ouro(ids, init_scale=1.0, generator=torch.Generator().manual_seed(0)).logits
        b = ouro(ids, init_scale=0.0).logits
    assert torch.equal(a, b) and OuroLM.random_initial_state is False


def test_save_and_load_round_trip_bit_for_bit(ouro, tmp_path):
    ouro.save_pretrained(tmp_path / "copy")
    again = rm.load_model(tmp_path / "copy")
    for (k, v), (k2, v2) in zip(ouro.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    assert again.config.layer_types == ouro.config.layer_types


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, target)
    return target


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None and key.startswith("drop_"):
            raw.pop(key.removeprefix("drop_"))
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))


def _edit_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = dict(load_file(path))
    edit(tensors)
    save_file(tensors, path)


FAULTS = {
    "unknown model type": (
        lambda d: _edit_config(d, model_type="looped_mystery"),
        ConfigError, r"model_type 'looped_mystery'.*known: 'ouro' \(Ouro\)",
    ),
    "missing field": (
        lambda d: _edit_config(d, drop_num_hidden_layers=None),
        ConfigError, "lacks num_hidden_layers",
    ),
    "rope scaling": (
        lambda d: _edit_config(d, rope_scaling={"type": "yarn"}),
        ConfigError, "rope_scaling",
    ),
    "layer types": (
        lambda d: _edit_config(d, layer_types=["full_attention"]),
        ConfigError, "layer_types",
    ),
    "missing tensor": (
        lambda d: _edit_weights(d, lambda t: t.pop("model.layers.1.input_layernorm_2.weight")),
        CheckpointError, r"missing tensor model\.layers\.1\.input_layernorm_2\.weight",
    ),
    "missing head": (
        lambda d: _edit_weights(d, lambda t: t.pop("lm_head.weight")),
        CheckpointError, r"missing tensor lm_head\.weight",
    ),
    "misshapen tensor": (
        lambda d: _edit_weights(d, lambda t: t.update({"model.norm.weight": torch.ones(65)})),
        CheckpointError, r"model\.norm\.weight has shape \[65\]",
    ),
    "unexpected tensor": (
        lambda d: _edit_weights(d, lambda t: t.update({"model.extra.weight": torch.ones(3)})),
        CheckpointError, r"unexpected tensor model\.extra\.weight",
    ),
    "truncated weights": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:999]),
        CheckpointError, "not a readable safetensors file",
    ),
    "config not an object": (
        lambda d: (d / "config.json").write_text("[1, 2]"),
        ConfigError, "not a JSON object",
    ),
}  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_a_bad_checkpoint_is_refused_in_one_line(tmp_path, fault):
    inject, error, message = FAULTS[fault]
    directory = _copy(tmp_path)
    inject(directory)
    with pytest.raises(error, match=message):
        rm.load_model(directory)


def test_bad_calls_are_refused_in_one_line(ouro):
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match="num_steps must be >= 0"):
        ouro(ids, num_steps=-1)
    with pytest.raises(ValueError, match="init_state has shape"):
        ouro(ids, init_state=torch.zeros(1, 2, 64))
    with pytest.raises(ContextLengthError, match="exceeds the model's context of 64"):
        ouro(torch.zeros(1, 65, dtype=torch.long))


def test_the_registry_picks_the_family_from_model_type():
    raw = json.loads((CHECKPOINT / "config.json").read_text())
    assert family_of(raw).name == "Ouro"
    default = Path(__file__).resolve().parents[1] / "checkpoints" / "default" / "config.json"
    assert family_of(json.loads(default.read_text())).name == "Huginn"


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _own_tokenizer(directory: Path, size: int = 128, template: object = CHATML) -> None:
    """A tokenizer of Ouro's kind (no Huginn specials) with a ChatML template and EOS id 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hello"]
    vocab = {w: i for i, w in enumerate([*words, *(f"w{i}" for i in range(size - len(words)))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Split("\n", "isolated")
    backend.add_special_tokens(words[:3])
    backend.save(str(directory / "tokenizer.json"))
    settings = {"chat_template": template, "eos_token": {"content": "<|im_end|>"}}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    _edit_config(directory, eos_token_id=2, bos_token_id=None)


def test_the_checkpoints_own_tokenizer_and_chat_template(tmp_path):
    directory = _copy(tmp_path)
    _own_tokenizer(directory)
    tokenizer = rm.load_model(directory, require_tokenizer=True).tokenizer
    assert type(tokenizer).__name__ == "PretrainedTokenizer" and tokenizer.stop_ids == (2,)
    chat = [{"role": "user", "content": "hello"}]
    text = tokenizer.apply_chat_template(chat)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode_chat(chat)
    assert ids[0] == 1 and 2 in ids and ids.count(1) == 2  # the specials as single ids


def test_a_bad_tokenizer_of_another_family_is_refused_in_one_line(tmp_path):
    from recurrent_model.tokenizer import TokenizerError

    big = _copy(tmp_path / "big")
    _own_tokenizer(big, size=200)
    with pytest.raises(
        CheckpointError, match="has 200 tokens but the model's vocabulary holds 128"
    ):
        rm.load_model(big)
    broken = _copy(tmp_path / "broken")
    _own_tokenizer(broken, template="{% for m in messages %}{{ m['role'] }")
    with pytest.raises(TokenizerError, match="chat template failed"):
        rm.load_model(broken).tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    hostile = _copy(tmp_path / "hostile")  # the sandbox refuses attribute access to internals
    _own_tokenizer(hostile, template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(TokenizerError, match="chat template failed"):
        rm.load_model(hostile).tokenizer.encode_chat([{"role": "user", "content": "hello"}])


def test_a_cache_filled_at_another_depth_is_refused(ouro, reference):
    from recurrent_model.llama_layers import SlotCache

    ids, cache = reference["input_ids"], SlotCache()
    with torch.no_grad():
        ouro(ids[:, :4], num_steps=2, cache=cache)
        with pytest.raises(
            ValueError, match="slot 4 holds 0 positions but this chunk starts at position 4"
        ):
            ouro(ids[:, 4:5], num_steps=4, cache=cache, start=4)


def test_the_command_line_says_it_serves_huginn_only(tmp_path, capsys):
    from recurrent_model.cli import main
    from recurrent_model.ouro import OuroConfig
    from recurrent_model.standin import byte_level_tokenizer

    model = OuroLM(OuroConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, vocab_size=512, max_position_embeddings=64))  # fmt: skip
    model.tokenizer = byte_level_tokenizer(512)
    model.save_pretrained(tmp_path / "ouro")
    assert main(["--checkpoint", str(tmp_path / "ouro"), "--prompt", "hi"]) == 2
    assert "a model of the Ouro family generates through model.generate" in capsys.readouterr().err
