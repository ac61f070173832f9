"""Inductor's graph called without torch.compile's per-call wrappers: found only under the layout
it was checked on, used by a decode's direct caller only in inference mode and only where it
returns the graph's own outputs."""

from __future__ import annotations

import pytest
import torch

from recurrent_model import compiled as C
from recurrent_model.inductor_boxed import boxed_graph


def test_no_graph_is_found_under_other_callables():
    def inner(*args):
        return args

    def wrapper(*args):
        return inner(*args)

    assert boxed_graph(lambda *args: args) is None
    assert boxed_graph(wrapper) is None  # a closure, but not dynamo's disable wrapper
    assert boxed_graph(len) is None  # no Python code at all


def _graph_outputs_fresh_and_cached() -> list[tuple[list, torch.Tensor, torch.Tensor]]:
    """A function that writes an input, compiled fresh (inductor's and AOT autograd's caches off)
    and then loaded from those caches: per compile, what its boxed graph returned, its output and
    the input it wrote, called once through torch.compile and once through the boxed graph."""
    results = []
    for cached in (False, True, True):  # the second cached compile loads from the first's entries
        torch._dynamo.reset()
        recorder = C._RecordingInductor()
        compiled = torch.compile(lambda x, slot: (slot.add_(x), x * 2)[1], backend=recorder)
        with (
            torch._inductor.config.patch(fx_graph_cache=cached),
            torch._functorch.config.patch(enable_autograd_cache=cached),
            torch.inference_mode(),
        ):
            x, slot = torch.arange(4.0), torch.zeros(4)
            out = compiled(x, slot)
            boxed = boxed_graph(recorder.captured.run)
            assert boxed is not None, f"no graph found ({'cached' if cached else 'fresh'} compile)"
            named = {"L['x']": x, "L['slot']": slot}
            again = boxed([named[source] for source in recorder.captured.sources])  # dynamo's order
        results.append((again, out, slot - 2 * x))
    return results


@pytest.mark.skipif(not C.direct_calls_supported(), reason="checked torch releases only")
def test_the_graph_under_a_fresh_or_cached_compiles_wrappers_gives_its_outputs():
    for again, out, left in _graph_outputs_fresh_and_cached():
        assert len(again) == 1 and torch.equal(again[0], out)
        assert not left.any()  # the graph wrote its input itself, both times


def _plus_one() -> tuple[C._Captured, tuple, torch.Tensor, torch.Tensor]:
    x, s0 = torch.ones(1, 1), torch.zeros(1, 1, 4)
    args = (None, x, None, None, s0, None, None, None, 1, True, True)
    return C._Captured(lambda s, x: (x + 1,), ("L['state']", "L['x']"), 1), args, x, s0


def test_a_boxed_graph_is_kept_only_where_it_returns_the_graphs_outputs(monkeypatch):
    captured, args, x, s0 = _plus_one()
    candidates = {
        "an extra output": lambda inputs: [inputs[1] + 1, inputs[0]],  # a mutation applied after
        "other values": lambda inputs: [inputs[1] + 2],
        "the same": lambda inputs: [inputs[1] + 1],
    }
    for name, boxed in candidates.items():
        monkeypatch.setattr(C, "boxed_graph", lambda run, boxed=boxed: boxed)
        with torch.inference_mode():
            direct = C.CompileState().direct_graph((name,), captured, args, (x + 1, s0))
        assert direct is not None and (direct.boxed is boxed) == (name == "the same"), name
    state = C.CompileState()  # outside inference mode, where it would not be used: not looked up
    assert state.direct_graph(("plain",), captured, args, (x + 1, s0)).boxed is None


def test_the_boxed_graph_runs_in_inference_mode_only(monkeypatch):
    captured, args, x, s0 = _plus_one()
    calls = []

    def boxed(inputs):
        calls.append(len(inputs))
        return [inputs[1] + 1]

    monkeypatch.setattr(C, "boxed_graph", lambda run: boxed)
    with torch.inference_mode():
        direct = C.CompileState().direct_graph(("key",), captured, args, (x + 1, s0))
    calls.clear()
    five = torch.full((1, 1), 5.0)
    y, s = direct(five, None, s0, None, None)  # grad mode: through torch.compile's wrappers
    assert calls == [] and torch.equal(y, five + 1) and s is s0
    with torch.inference_mode():
        y, s = direct(five, None, s0, None, None)
    assert calls == [2] and torch.equal(y, five + 1) and s is s0
