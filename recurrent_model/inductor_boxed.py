"""Inductor's compiled graph without torch.compile's per-call Python wrappers, where they decide nothing.

``compile_fx`` returns a graph's compiled code inside three Python layers, run on every call:
dynamo's ``disable`` wrapper (sets and restores the frame hook), AOT autograd's ``forward``
(prepends lifted parameters and buffers) and its generated runtime wrapper (bumps the version
counters of the inputs the graph writes, turns grad mode off for the call, checks the number of
outputs, then applies any input mutation and output alias the graph could not keep). A compiled
decode token called in inference mode, outside any compiled frame, with no lifted parameters and
every cache write inside the graph, passes through all three unchanged: inference tensors have no
version counters, the compiled code records no autograd, and there is nothing to apply after it.

:func:`boxed_graph` finds, under those layers, inductor's graph (a ``CompiledFxGraph``) and returns
its boxed callable (one list of inputs, cleared by the call), or None where any layer differs from
that shape. The layers are torch internals, so this holds on the releases in
``compiled.DIRECT_CALL_TORCH`` only, and the caller checks the result on real inputs before using
it (:meth:`compiled.CompileState.direct_graph`): the same outputs as the wrapped graph, and as many.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _cells(function: Any) -> dict[str, Any]:
    """A Python function's closure by variable name."""
    code, closure = function.__code__, function.__closure__ or ()
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, closure, strict=True)}


def _unwrapped(layer: Any) -> Any:
    """``layer`` without AOT autograd's ``SerializableCompiledFunction`` shells, which call what
    they hold and nothing else (a fresh compile and one loaded from AOT autograd's cache put them
    at different depths)."""
    from torch._functorch._aot_autograd.runtime_wrappers import SerializableCompiledFunction

    while type(layer) is SerializableCompiledFunction:
        layer = layer.compiled_fn
    return layer


def boxed_graph(run: Callable) -> Callable[[list], Any] | None:
    """The boxed callable of the inductor graph that ``run`` (what ``compile_fx`` returned) wraps;
    None unless ``run`` is dynamo's disable wrapper around AOT autograd's ``forward`` with no lifted
    parameters, around a runtime wrapper whose compiled function is inductor's graph."""
    from torch._inductor.output_code import CompiledFxGraph  # the compiler loads on first use only

    try:
        forward = _cells(run)["fn"]
        layers = _cells(forward)
        if layers["params_buffers_flat"]:
            return None
        runtime_wrapper = _unwrapped(layers["compiled_fn"])
        graph = _unwrapped(_cells(runtime_wrapper)["_inner_compiled_fn"])
    except (KeyError, AttributeError, TypeError, ValueError):
        return None
    if type(graph) is not CompiledFxGraph or not callable(graph.current_callable):
        return None
    return graph.current_callable
