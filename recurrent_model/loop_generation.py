"""Generation for a family whose head reads every loop's state directly (Ouro): every token runs all
r loops, so that later tokens find every (loop, layer) slot of the KV cache filled, as the published
code does, and an exit criterion chooses which loop's logits give the token.

With ``exit_criterion="exit-gate"`` a token takes the first loop whose cumulative exit probability
reaches ``exit_threshold`` (Ouro's published exit rule); any other generate criterion of
``criteria.CRITERIA`` judges the loops the same way (the first loop, from ``min_steps`` on, where it
passes). Without one, the last loop's logits give the token.

``compile=True`` decodes each token after the prompt through compiled graphs
(:mod:`recurrent_model.loop_compiled`) on the families that have them (``model.loop_decode``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import hook_names
from .llama_layers import SlotCache
from .options import check_int, check_prompt, stop_tokens_for
from .sampling import ExitCriterion, Sampler

EXIT_GATE = "core.hook_exit_gate"


@dataclass
class LoopGenerationOutput:
    """sequences (B, T + new); exit_steps (B, new): the 1-based loop whose logits chose each new
    token (r without an exit criterion); num_steps: the loops every token ran."""

    sequences: torch.Tensor
    exit_steps: torch.Tensor
    num_steps: int


@torch.no_grad()
def generate_every_loop(
    model: Any,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    num_steps: int | None = None,
    *,
    exit_criterion: str | None = None,
    exit_threshold: float | None = None,
    min_steps: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    stop_tokens: tuple[int, ...] | None = None,
    init_scale: float = 1.0,
    return_details: bool = False,
    compile: bool = False,
    streamer: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor | LoopGenerationOutput:
    """Greedy (or sampled) continuation of ``input_ids`` (B, T; rows of equal length) by
    ``max_new_tokens`` tokens; rows that produced a stop token continue with that token.
    ``init_scale`` scales a family's random s_0 (drawn afresh for each chunk; 0: zeros), as the
    forward takes it; a family that starts from the embedding ignores it. ``compile``: see the
    module's docstring; a family without compiled tokens, or attached hooks, is refused.
    ``streamer(tokens, loops)`` is called with each new token (B,) and its chosen loop (B,)."""
    ids = check_prompt(model, input_ids, max_new_tokens)
    steps = check_int("num_steps", model.default_steps() if num_steps is None else num_steps, 1)
    check_int("min_steps", min_steps, 1)
    if exit_criterion is None and exit_threshold is not None:
        raise ValueError("exit_threshold needs an exit_criterion")
    criterion = ExitCriterion(exit_criterion, exit_threshold) if exit_criterion else None
    sampler = Sampler(do_sample, temperature, top_k, top_p, None, generator)
    stops = torch.tensor(stop_tokens_for(model, stop_tokens), device=ids.device)
    cache, chunk, start = SlotCache(), ids, 0
    compiled = _compiled_decode(model, ids, max_new_tokens, steps) if compile else None
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    new_tokens, exits = [], []
    for _ in range(max_new_tokens):
        if compiled is not None and start > 0:
            states, gates = compiled.token(chunk, start)
            logits, chosen = _choose_loop(states, gates, compiled.logits, criterion, min_steps)
        else:
            start_state = {"init_scale": init_scale, "generator": generator}
            logits, chosen = _last_position(model, chunk, steps, cache, start, criterion,
                                            min_steps, start_state)  # fmt: skip
            if compiled is not None:
                compiled.fill(cache)
        token, _ = sampler.choose(logits)
        token = torch.where(done, new_tokens[-1] if new_tokens else token, token)
        done |= torch.isin(token, stops)
        new_tokens.append(token)
        exits.append(chosen)
        if streamer is not None:
            streamer(token, chosen)
        start += chunk.shape[1]
        chunk = token[:, None]
    sequences = torch.cat([ids, torch.stack(new_tokens, dim=1)], dim=1)
    if not return_details:
        return sequences
    return LoopGenerationOutput(sequences, torch.stack(exits, dim=1), steps)


def _compiled_decode(model: Any, ids: torch.Tensor, max_new_tokens: int, steps: int) -> Any:
    """The family's compiled decode for this call, or a ValueError saying why there is none."""
    if not hasattr(model, "loop_decode"):
        raise ValueError(f"compile=True: the {model.family} family has no compiled decode; "
                         "drop compile")  # fmt: skip
    if model.has_hooks():
        raise ValueError("compile=True decodes without hooks and cannot run the attached hooks: "
                         "drop compile or the hooks")  # fmt: skip
    return model.loop_decode(ids.shape[0], ids.shape[1] + max_new_tokens, steps)


def _last_position(
    model: Any,
    chunk: torch.Tensor,
    steps: int,
    cache: SlotCache,
    start: int,
    criterion: ExitCriterion | None,
    min_steps: int,
    start_state: dict,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk run through every loop with the cache; at its last position, the logits (B, V)
    of the chosen loop and that loop (1-based, (B,))."""
    if criterion is None:
        out = model(chunk, num_steps=steps, cache=cache, start=start, **start_state)
        return out.logits[:, -1], torch.full_like(chunk[:, 0], steps)
    names = [hook_names.STATE, EXIT_GATE]
    _, recorded = model.run_with_cache(chunk, num_steps=steps, names_filter=names,
                                       cache=cache, start=start, **start_state)  # fmt: skip
    states = recorded[hook_names.STATE][:, :, -1:]  # (r + 1, B, 1, h)
    gates = recorded[EXIT_GATE][:, :, -1]  # (r, B)
    return _choose_loop(list(states), list(gates[..., None]), lambda s: model.coda(s)[0],
                        criterion, min_steps)  # fmt: skip


def _choose_loop(
    states: list[torch.Tensor],
    gates: list[torch.Tensor],
    head: Any,
    criterion: ExitCriterion | None,
    min_steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """From every loop's state s_0 … s_r (each (B, 1, h)) and gate λ_1 … λ_r (each (B, 1)) of
    one position: the logits (B, V) of the loop the criterion chooses (the last without one) and
    that loop (1-based, (B,)); ``head`` maps states (…, h) to logits."""
    steps = len(gates)
    if criterion is None:
        last = states[-1][:, -1]
        return head(last), torch.full(last.shape[:1], steps, device=last.device)
    every = head(torch.stack(states[1:])[:, :, -1])  # (r, B, V): each loop's logits
    criterion.reset()
    passed = torch.stack([
        criterion(states[step], states[step - 1], every[step - 1], gates[step - 1][:, -1])
        for step in range(1, steps + 1)
    ])  # fmt: skip
    loops = torch.arange(1, steps + 1, device=passed.device)[:, None]
    passed &= (loops >= min_steps) | (loops == steps)
    passed[-1] = True  # the last loop takes every row that has not exited
    chosen = passed.long().argmax(dim=0) + 1
    return every[chosen - 1, torch.arange(every.shape[1], device=every.device)], chosen
