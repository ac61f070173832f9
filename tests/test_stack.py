"""stack.run, the one driver of the forward recipe: its policies give the module forward's results."""

from __future__ import annotations

import torch

import recurrent_model as rm
from recurrent_model import stack


def small_model() -> rm.RecurrentLM:
    torch.manual_seed(0)
    model = rm.RecurrentLM(rm.preset("tiny", n_embd=32, n_heads=2, intermediate_size=64)).eval()
    with torch.no_grad():  # non-trivial norms, so that a misplaced one shows
        for name, p in model.named_parameters():
            if ".norm_" in name or "ln_f" in name:
                p.uniform_(0.5, 1.5)
    return model


def test_tensor_weights_and_pieces_give_the_module_forward_bit_for_bit():
    model = small_model()
    ids = torch.randint(
        0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1)
    )
    s0 = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids, num_steps=5, init_state=s0)
        w, rope = stack.LayerStack.of(model), model.rope_at(0, 5)
        whole = stack.run(w, ids, rope, 5, lambda e: s0)
        head = stack.run(w, ids, rope, 2, s0, last=False)  # prelude and two iterations
        tail = stack.run(w, head.e, rope, 3, head.state, first=False)  # three more and the coda
    for out in (whole, tail):
        assert torch.equal(out.logits, ref.logits) and torch.equal(out.latents, ref.latents)
        assert torch.equal(out.state, ref.state)
    assert head.logits is None and head.latents is None


def test_on_step_sees_every_iteration_and_may_replace_the_state_or_stop():
    model = small_model()
    ids = torch.randint(
        0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3)
    )
    w, rope = stack.LayerStack.of(model), model.rope_at(0, 4)
    seen = []

    def stop_at_two(step, new, previous):
        seen.append((step, previous))
        return stack.StepOutcome(new, stop=step == 2)

    with torch.no_grad():
        start = torch.zeros(1, 4, 32)
        stopped = stack.run(w, ids, rope, 6, start, on_step=stop_at_two)
        two = stack.run(w, ids, rope, 2, start)
        frozen = stack.run(
            w, ids, rope, 3, start, on_step=lambda step, new, prev: stack.StepOutcome(prev)
        )
    assert [step for step, _ in seen] == [1, 2] and seen[0][1] is start
    assert torch.equal(stopped.logits, two.logits) and torch.equal(stopped.state, two.state)
    assert frozen.state is start  # every iteration's result replaced by the state before it
