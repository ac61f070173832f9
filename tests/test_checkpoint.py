"""Checkpoint I/O in the Huginn layout: round trips, hand-built shards, and every malformed case."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

import recurrent_model as rm
from recurrent_model import checkpoint as ckpt
from recurrent_model import saving

INDEX = saving.INDEX_FILE

# A config.json as other tools write it: extra fields we must ignore.
HF_EXTRAS = {
    "architectures": ["RavenForCausalLM"],
    "auto_map": {"AutoConfig": "raven_config_minimal.RavenConfig"},
    "init_values": {"std": 0.1, "embed_scale": 8.0},
    "head_dim": 16,
    "dtype": "float32",
    "transformers_version": "4.44.2",
}


def hand_built_sharded(model: rm.RecurrentLM, directory, with_head: bool = False) -> None:
    """Write a checkpoint by hand from the spec: config.json + two shards + index, with freqs_cis."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {**model.config.to_dict(), **HF_EXTRAS}
    (directory / "config.json").write_text(json.dumps(cfg))
    tensors = {
        k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"
    }
    if with_head:
        tensors["lm_head.weight"] = model.transformer.wte.weight.detach().clone()
    tensors["freqs_cis"] = torch.randn(16, 4, 2)  # wrong on purpose: must be recomputed
    keys = sorted(tensors)
    first, second = keys[: len(keys) // 2], keys[len(keys) // 2 :]
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for name, part in zip(names, (first, second), strict=True):
        save_file({k: tensors[k] for k in part}, directory / name)
    weight_map = {k: names[0] for k in first} | {k: names[1] for k in second}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_save_load_round_trip_is_bit_exact(model, tmp_path):
    model.save_pretrained(tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    loaded = rm.load_model(tmp_path / "ck")
    assert not loaded.training
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    ids = torch.randint(0, 512, (1, 8))
    assert torch.equal(model(ids, 3, init_scale=0).logits, loaded(ids, 3, init_scale=0).logits)
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["model_type"] == "huginn_raven"


def test_sharded_save_round_trip(model, tmp_path):
    ckpt.save_pretrained(model, tmp_path / "sh", max_shard_bytes=200_000)
    assert (tmp_path / "sh" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "sh").glob("model-*-of-*.safetensors"))) > 1
    loaded = rm.load_model(tmp_path / "sh")
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True)
    )


@pytest.mark.parametrize("with_head", [False, True])
def test_hand_built_sharded_checkpoint_loads(model, tmp_path, with_head):
    hand_built_sharded(model, tmp_path / "hf", with_head)
    loaded = rm.load_model(tmp_path / "hf", dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert loaded.rope_at(0, 16).dtype == torch.complex64  # float32 RoPE under a bf16 model
    torch.testing.assert_close(loaded.rope_at(0, 16), model.rope_at(0, 16))  # not freqs_cis
    ids = torch.randint(0, 512, (1, 8))
    ref = model(ids, 2, init_scale=0).logits
    torch.testing.assert_close(loaded(ids, 2, init_scale=0).logits, ref, rtol=0.1, atol=0.15)
    full = rm.load_model(tmp_path / "hf")
    assert torch.equal(full(ids, 2, init_scale=0).logits, ref)


def test_untied_head_is_refused(model, tmp_path):
    hand_built_sharded(model, tmp_path / "hf", with_head=False)
    save_file(
        {"lm_head.weight": torch.randn(512, 64)},
        tmp_path / "hf" / "model-00002-of-00002.safetensors",
    )
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    index["weight_map"] = {"lm_head.weight": "model-00002-of-00002.safetensors"} | {
        k: v for k, v in index["weight_map"].items() if v.startswith("model-00001")
    }
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(rm.CheckpointError, match="missing tensor"):
        rm.load_model(tmp_path / "hf")


def write_checkpoint(model, directory, config_changes=None, drop=None, extra=None, reshape=None):
    directory.mkdir()
    cfg = model.config.to_dict() | (config_changes or {})
    for key in [k for k, v in cfg.items() if v is None]:
        del cfg[key]
    (directory / "config.json").write_text(json.dumps(cfg))
    tensors = {
        k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"
    }
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = torch.zeros(3, 5)
    tensors.update(extra or {})
    save_file(tensors, directory / "model.safetensors")
    return directory


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_embd": None}, "missing required field.*n_embd"),
        ({"injection_type": "add"}, "injection_type='add'.*not support"),
        ({"norm_class_name": "LayerNorm"}, "norm_class_name='LayerNorm'"),
        ({"block_class_name": "TransformerPreNormBlock"}, "block_class_name"),
        ({"bias": True}, "bias=True"),
        ({"n_heads": 5, "num_attention_heads": 5, "num_key_value_heads": 5}, "not divisible"),
        ({"num_key_value_heads": 1}, "grouped key/value heads"),
        ({"n_layers": 7}, "n_layers=7"),
    ],
)
def test_config_errors_name_the_field(model, tmp_path, changes, message):
    write_checkpoint(model, tmp_path / "bad", config_changes=changes)
    with pytest.raises(rm.ConfigError, match=message):
        rm.load_model(tmp_path / "bad")


def test_tensor_errors_name_the_tensor_and_shapes(model, tmp_path):
    key = "transformer.core_block.1.mlp.fc.weight"
    write_checkpoint(model, tmp_path / "missing", drop=key)
    with pytest.raises(
        rm.CheckpointError,
        match=r"missing tensor transformer.core_block.1.mlp.fc.weight \(expected shape \[256, 64\]\)",
    ):
        rm.load_model(tmp_path / "missing")
    write_checkpoint(
        model, tmp_path / "extra", extra={"transformer.core_block.9.norm_1.weight": torch.ones(64)}
    )
    with pytest.raises(
        rm.CheckpointError,
        match=r"unexpected tensor transformer.core_block.9.norm_1.weight with shape \[64\]",
    ):
        rm.load_model(tmp_path / "extra")
    write_checkpoint(model, tmp_path / "shape", reshape="transformer.adapter.weight")
    with pytest.raises(
        rm.CheckpointError,
        match=r"transformer.adapter.weight has shape \[3, 5\].*needs \[64, 128\]",
    ):
        rm.load_model(tmp_path / "shape")


def test_path_errors(tmp_path):
    with pytest.raises(rm.CheckpointError, match="does not exist"):
        rm.load_model(tmp_path / "nowhere")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(rm.CheckpointError, match="is not a directory"):
        rm.load_model(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(rm.CheckpointError, match="no config.json"):
        rm.load_model(tmp_path / "empty")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(rm.preset("tiny").to_dict()))
    with pytest.raises(rm.CheckpointError, match="has no weights"):
        rm.load_model(tmp_path / "noweights")
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    with pytest.raises(rm.ConfigError, match="not valid JSON"):
        rm.load_model(tmp_path / "badjson")


class _Trap:
    """Unpickling this object would create a marker file: proof that a loader unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_weights_are_refused_and_never_unpickled(tmp_path):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(rm.preset("tiny").to_dict()))
    marker = tmp_path / "UNPICKLED"
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(str(marker))))
    with pytest.raises(rm.CheckpointError, match="pickle.*never unpickles"):
        rm.load_model(d)
    assert not marker.exists()


def test_corrupt_safetensors_is_a_clear_error(model, tmp_path):
    d = write_checkpoint(model, tmp_path / "corrupt")
    (d / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(rm.CheckpointError, match="not a readable safetensors file"):
        rm.load_model(d)


def test_crash_during_save_keeps_the_previous_checkpoint(model, tmp_path, monkeypatch):
    target = tmp_path / "ck"
    model.save_pretrained(target)
    before = (target / "model.safetensors").read_bytes()

    def half_write(tensors, path, metadata=None):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(saving, "save_file", half_write)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(target)
    assert (target / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary left behind
    rm.load_model(target)


def test_save_killed_between_renames_points_at_the_previous_checkpoint(model, tmp_path):
    model.save_pretrained(tmp_path / "ck")
    (tmp_path / "ck").rename(tmp_path / ".ck.old-1234abcd")  # the state after the first rename
    with pytest.raises(
        rm.CheckpointError,
        match=r"interrupted save left the previous checkpoint at .*\.ck\.old-1234abcd",
    ):
        rm.load_model(tmp_path / "ck")
    rm.load_model(tmp_path / ".ck.old-1234abcd")


def test_kill_during_save_leaves_previous_checkpoint(model, tmp_path):
    """A SIGKILL in the middle of writing (here: after the weights, before the swap) loses nothing."""
    target = tmp_path / "ck"
    model.save_pretrained(target)
    script = textwrap.dedent(
        f"""
        import os, signal, torch, recurrent_model as rm
        from recurrent_model import saving
        model = rm.RecurrentLM(rm.preset("tiny"))
        real = saving.save_file
        def then_die(*a, **k):
            real(*a, **k)
            os.kill(os.getpid(), signal.SIGKILL)
        saving.save_file = then_die
        model.save_pretrained({str(target)!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    loaded = rm.load_model(target)
    assert torch.equal(loaded.transformer.wte.weight, model.transformer.wte.weight)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "ck"]
    assert all(name.startswith(".ck.tmp-") for name in leftovers)
    model.save_pretrained(target)  # a later save still works beside the leftover


def test_loading_streams_shards_within_one_model_of_memory(tmp_path):
    """Peak RSS while loading stays near one copy of the weights, not two."""
    cfg = rm.preset("tiny", n_embd=512, n_heads=8, intermediate_size=2048, vocab_size=32768)
    model = rm.RecurrentLM(cfg)
    size = (
        sum(t.numel() * 4 for t in model.state_dict().values()) - model.lm_head.weight.numel() * 4
    )
    ckpt.save_pretrained(model, tmp_path / "big", max_shard_bytes=size // 4)
    del model
    script = textwrap.dedent(
        f"""
        import resource, torch, recurrent_model as rm
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        m = rm.load_model({str(tmp_path / "big")!r})
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((peak - base) * 1024)
        """
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    grown = int(out.stdout.strip())
    assert grown < 1.5 * size, (grown, size)


def test_load_weights_into_keeps_parameter_objects_and_checks_shapes(model, tmp_path):
    ckpt.save_pretrained(model, tmp_path / "sh", max_shard_bytes=200_000)
    target = rm.RecurrentLM(rm.preset("tiny"))
    before = [id(p) for p in target.parameters()]
    ckpt.load_weights_into(target, tmp_path / "sh")
    assert [id(p) for p in target.parameters()] == before
    for a, b in zip(model.state_dict().values(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    wider = rm.RecurrentLM(rm.preset("tiny", intermediate_size=96))
    with pytest.raises(rm.CheckpointError, match=r"mlp.fc.weight has shape \[256, 64\]"):
        ckpt.load_weights_into(wider, tmp_path / "sh")


# dtype=None: the checkpoint's own dtype -----------------------------------------------------------
def test_dtype_none_keeps_the_saved_dtype_and_config_names_it(model, tmp_path):
    half = rm.RecurrentLM(rm.preset("tiny"), init_weights=False)
    half.load_state_dict(model.state_dict())
    half.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert rm.load_model(tmp_path / "bf16").dtype == torch.bfloat16
    assert rm.load_model(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16
    assert rm.load_model(tmp_path / "bf16", dtype="float32").dtype == torch.float32


@pytest.mark.parametrize(
    ("fields", "tensor_dtype", "loaded"),
    [
        ({"dtype": "bfloat16"}, torch.float32, torch.bfloat16),  # the newer field name
        ({"torch_dtype": "float16"}, torch.float32, torch.float16),  # the config wins, as in HF
        ({"torch_dtype": "float32"}, torch.bfloat16, torch.float32),  # bf16 files, float32 config
        ({}, torch.bfloat16, torch.bfloat16),  # no field: the tensors' dtype
        ({}, torch.float32, torch.float32),
    ],
)
def test_stored_dtype_follows_the_config_then_the_tensors(
    model, tmp_path, fields, tensor_dtype, loaded
):
    d = tmp_path / "ck"
    d.mkdir()
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in ("torch_dtype", "dtype")}
    (d / "config.json").write_text(json.dumps(cfg | fields))
    tensors = {
        k: v.to(tensor_dtype) for k, v in model.state_dict().items() if k != "lm_head.weight"
    }
    save_file(tensors, d / "model.safetensors")
    assert rm.load_model(d).dtype == loaded


def test_unknown_config_dtype_is_named(model, tmp_path):
    write_checkpoint(model, tmp_path / "ck", config_changes={"torch_dtype": "float8_e4m3fn"})
    with pytest.raises(rm.ConfigError, match="torch_dtype='float8_e4m3fn'.*unknown dtype"):
        rm.load_model(tmp_path / "ck")


def test_default_checkpoint_loads_in_float32_unchanged():
    """checkpoints/default stores float32 (config and tensors): dtype=None gives the float32 model."""
    from recurrent_model.standin import DEFAULT_CHECKPOINT

    assert json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())["torch_dtype"] == "float32"
    own, f32 = rm.load_model(DEFAULT_CHECKPOINT), rm.load_model(DEFAULT_CHECKPOINT, dtype="float32")
    assert own.dtype == torch.float32
    ids = torch.tensor([own.tokenizer.encode("def add(a, b):")])
    assert torch.equal(own(ids, 4, init_scale=0).logits, f32(ids, 4, init_scale=0).logits)


# Building on the meta device ----------------------------------------------------------------------
def test_loading_never_initialises_weights(model, tmp_path, monkeypatch):
    """The model is built on the meta device: no default init that the weights would overwrite."""
    model.save_pretrained(tmp_path / "ck")

    def no_init(*args, **kwargs):
        raise AssertionError("the model's initialiser ran while loading")

    def meta_only(cls):
        real = cls.reset_parameters

        def reset(self):  # torch's modules initialise in their constructor: on meta, that is free
            assert self.weight.is_meta, f"a {cls.__name__} was initialised in real memory"
            real(self)

        monkeypatch.setattr(cls, "reset_parameters", reset)

    monkeypatch.setattr(rm.RecurrentLM, "reset_parameters", no_init)
    meta_only(torch.nn.Linear)
    meta_only(torch.nn.Embedding)
    loaded = rm.load_model(tmp_path / "ck")
    assert not any(p.is_meta for p in loaded.parameters())
    assert not any(b.is_meta for b in loaded.buffers())
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert all(p.requires_grad for p in loaded.parameters())
    torch.testing.assert_close(loaded.rope_at(0, 16), model.rope_at(0, 16), rtol=0, atol=0)


# The tokenizer, checked before any weight is read -------------------------------------------------
def _no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the tokenizer was checked")

    monkeypatch.setattr(ckpt, "read_headers", refuse)
    monkeypatch.setattr(ckpt, "assign_weights", refuse)


def test_missing_tokenizer_is_refused_before_the_weights_when_required(
    model, tmp_path, monkeypatch
):
    model.save_pretrained(tmp_path / "ck")
    assert rm.load_model(tmp_path / "ck").tokenizer is None  # not required: loads without one
    _no_weights_read(monkeypatch)
    with pytest.raises(rm.CheckpointError, match=r"has no tokenizer\.json to encode a prompt"):
        rm.load_model(tmp_path / "ck", require_tokenizer=True)


def test_tokenizer_of_another_vocabulary_is_refused_before_the_weights(
    model, tmp_path, monkeypatch
):
    from recurrent_model.standin import byte_level_tokenizer

    model.save_pretrained(tmp_path / "ck")  # vocab_size 512
    byte_level_tokenizer(320).save(tmp_path / "ck" / "tokenizer.json")
    _no_weights_read(monkeypatch)
    with pytest.raises(
        rm.CheckpointError, match=r"has 320 tokens but the model's vocab_size is 512"
    ) as exc:
        rm.load_model(tmp_path / "ck")
    assert "\n" not in str(exc.value)


# Writing ------------------------------------------------------------------------------------------
def test_save_pretrained_method_shards_and_files_follow_the_umask(model, tmp_path):
    old = os.umask(0o022)
    try:
        model.save_pretrained(tmp_path / "sh", max_shard_bytes=200_000)
        os.umask(0o077)
        model.save_pretrained(tmp_path / "private")
    finally:
        os.umask(old)
    shards = sorted((tmp_path / "sh").glob("model-*-of-*.safetensors"))
    assert len(shards) > 1
    for path in [*shards, tmp_path / "sh" / "config.json", tmp_path / "sh" / INDEX]:
        assert path.stat().st_mode & 0o777 == 0o644, path
    for path in (tmp_path / "private").iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    loaded = rm.load_model(tmp_path / "sh")
    assert torch.equal(loaded.transformer.wte.weight, model.transformer.wte.weight)
    with pytest.raises(ValueError, match="max_shard_bytes must be positive"):
        model.save_pretrained(tmp_path / "none", max_shard_bytes=0)
