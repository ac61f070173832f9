"""Ouro's compiled decode tokens (recurrent_model/loop_compiled.py): the eager tokens, states and
exits; and what ``compile=True`` refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_family_model
from helpers import relative_error

import recurrent_model as rm
from recurrent_model import hook_names
from recurrent_model.llama_layers import SlotCache
from recurrent_model.loop_compiled import LoopDecode

CHECKPOINT = Path(__file__).resolve().parent / "data" / "ouro" / "checkpoint"


@pytest.mark.slow
def test_compiled_tokens_states_and_exits_equal_the_eager_ones_past_the_window(monkeypatch):
    # Every projection sum-written: the per-shape product choice is measured and tested in
    # tests/test_compile.py, and timing this checkpoint's shapes would be most of this test.
    from recurrent_model.compiled import CompileState

    monkeypatch.setattr(CompileState, "matvec_shapes", lambda self, config, dtype: ())
    ouro = rm.load_model(CHECKPOINT)  # a sliding window of 6 positions
    prompt = torch.tensor([[3, 17, 5, 9, 30]])
    for options in ({}, {"exit_criterion": "exit-gate", "exit_threshold": 0.5}):
        eager = ouro.generate(prompt, 6, return_details=True, stop_tokens=(), **options)
        compiled = ouro.generate(prompt, 6, return_details=True, stop_tokens=(), compile=True,
                                 **options)  # fmt: skip
        assert torch.equal(compiled.sequences, eager.sequences), options
        assert torch.equal(compiled.exit_steps, eager.exit_steps), options

    ids = eager.sequences[:, :-1]
    T = ids.shape[1]
    with torch.no_grad():
        _, recorded = ouro.run_with_cache(
            ids, names_filter=[hook_names.STATE, "core.hook_exit_gate"]
        )
        cache = SlotCache()
        ouro(ids[:, :-1], cache=cache)
    decode = LoopDecode(ouro, 1, T, ouro.default_steps())
    decode.fill(cache)
    states, gates = decode.token(ids[:, -1:], T - 1)
    for step, state in enumerate(states):
        assert relative_error(state[:, 0], recorded[hook_names.STATE][step, :, -1]) < 1e-5
    eager_gates = recorded["core.hook_exit_gate"][:, :, -1]
    assert relative_error(torch.cat(gates, dim=1)[0], eager_gates[:, 0]) < 1e-5
    with pytest.raises(ValueError, match="outside the compiled decode's 10 cache positions"):
        decode.token(ids[:, -1:], T)


def test_compile_is_refused_with_hooks_and_for_a_family_without_compiled_tokens():
    ouro = tiny_family_model("ouro")
    prompt = torch.tensor([[1, 2, 3]])
    with ouro.hooks([(hook_names.STATE, lambda x, hook: x)]):
        with pytest.raises(ValueError, match="cannot run the attached hooks"):
            ouro.generate(prompt, 2, compile=True)
    retrofit = tiny_family_model("retrofit")
    with pytest.raises(ValueError, match="family has no compiled decode"):
        retrofit.generate(prompt, 2, compile=True)
