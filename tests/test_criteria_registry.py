"""The exit and freeze criterion registry: the recipe of docs/contributing.md followed once.

A toy state criterion registered here (the relative change of the state, computed by its own
function) must be offered by generate, the diffusion sampler and the command line, and must decide
exactly as the built-in latent-diff does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from recurrent_model import cli
from recurrent_model.criteria import (
    CRITERIA,
    Criterion,
    freeze_strategies,
    names,
    on_states,
    register,
)
from recurrent_model.diffusion import FREEZE_STRATEGIES, generate_diffusion
from recurrent_model.generation import generate
from recurrent_model.sampling import EXIT_CRITERIA

CALLS: list[int] = []


def relative_move(now: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """‖now − before‖ / ‖now‖ written out here (no zero states occur in these runs)."""
    CALLS.append(now.shape[0])
    return (now - before).norm(dim=-1) / now.norm(dim=-1)


@pytest.fixture
def toy() -> Iterator[Criterion]:
    """The toy criterion, registered for both uses for one test."""
    criterion = register(
        Criterion("toy-move", False, 0.3, ("generate", "diffusion"), "‖Δ‖/‖s‖ by the test",
                  on_states(relative_move))
    )  # fmt: skip
    CALLS.clear()
    try:
        yield criterion
    finally:
        del CRITERIA[criterion.name]


def ids() -> torch.Tensor:
    return torch.randint(0, 512, (2, 5), generator=torch.Generator().manual_seed(4))


def test_a_registered_criterion_exits_generate_as_the_builtin_does(model, toy):
    kw = dict(num_steps=10, init_scale=0.0, stop_tokens=(), return_details=True)
    mine = generate(model, ids(), 6, exit_criterion="toy-move", exit_threshold=0.2, **kw)
    builtin = generate(model, ids(), 6, exit_criterion="latent-diff", exit_threshold=0.2, **kw)
    assert CALLS and int(mine.steps.min()) < 10  # computed by the toy, and it exited early
    assert torch.equal(mine.sequences, builtin.sequences)
    assert torch.equal(mine.steps, builtin.steps)
    default = generate(model, ids(), 2, exit_criterion="toy-move", **kw)
    assert torch.equal(
        default.steps, generate(model, ids(), 2, exit_criterion="latent-diff", exit_threshold=0.3,
                                **kw).steps
    )  # fmt: skip


def test_a_registered_state_criterion_freezes_the_diffusion_sampler(model, toy):
    kw = dict(num_steps=4, inner_recurrence=2, init_scale=0.0, stop_tokens=(), exit_t=0.2,
              return_details=True)  # fmt: skip
    mine = generate_diffusion(model, ids()[:1], 8, freeze_strategy="toy-move", **kw)
    builtin = generate_diffusion(model, ids()[:1], 8, freeze_strategy="latent-diff", **kw)
    assert CALLS
    assert torch.equal(mine.frozen, builtin.frozen)
    assert torch.equal(mine.frozen_lengths, builtin.frozen_lengths)
    assert int(mine.wave_widths.max()) > 1  # the wave really ran ahead of the frozen prefix


def test_the_command_line_and_the_lists_offer_it(toy):
    args = ["--checkpoint", "x", "--prompt", "y", "--exit", "toy-move"]
    assert cli.build_parser().parse_args(args).exit == "toy-move"
    args = ["--checkpoint", "x", "--prompt", "y", "--diffusion", "--freeze-strategy", "toy-move"]
    assert cli.build_parser().parse_args(args).freeze_strategy == "toy-move"
    assert names("generate") == (*EXIT_CRITERIA, "toy-move")
    assert freeze_strategies() == (*FREEZE_STRATEGIES[:-1], "toy-move", "fixed")


def test_register_refuses_duplicates_and_unknown_uses():
    for name in ("kl", "fixed"):
        with pytest.raises(ValueError, match=f"named '{name}' already exists"):
            register(Criterion(name, False, 1.0, ("generate",), "", on_states(relative_move)))
    with pytest.raises(ValueError, match="used_by must name generate and/or diffusion"):
        register(Criterion("toy-2", False, 1.0, ("app",), "", on_states(relative_move)))
    with pytest.raises(ValueError, match="needs a default"):
        register(Criterion("toy-3", False, None, ("generate",), "", on_states(relative_move)))
    assert not {"toy-2", "toy-3"} & set(CRITERIA)


def test_acceleration_2_without_a_common_position_freezes_nothing_that_step(model):
    # with headway 3 the first waves share no position with the prefill's single state
    out = generate_diffusion(model, ids()[:1], 6, num_steps=8, inner_recurrence=2, headway=3,
                             init_scale=0.0, freeze_strategy="latent-acceleration-2",
                             max_diffusion_steps=30, stop_tokens=(), return_details=True)  # fmt: skip
    lengths = out.frozen_lengths.tolist()
    assert lengths == sorted(lengths) and out.sampler_steps > 1
