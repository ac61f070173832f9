"""The wavefront analysis: tablets of the diffusion sampler -> long frame, frontier, heatmap."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from recurrent_model import RecurrentConfig, RecurrentLM
from recurrent_model.diffusion import generate_diffusion
from workbench import frontier_frame, wavefront_frame
from workbench.figures import wavefront_heatmap


def hand_made() -> SimpleNamespace:
    """Prompt of 2, two sampler steps with known tablets (num_steps 4, inner_recurrence 2)."""
    return SimpleNamespace(
        prompt_length=2,
        token_tablet=torch.tensor([[5, 6, 7, 8, -1], [5, 6, 7, 8, 9]]),
        counter_tablet=torch.tensor([[4, 4, 6, 2, 0], [4, 4, 6, 4, 2]]),
        stability_tablet=torch.tensor([[1, 1, 1, 0, 0], [2, 2, 2, 1, 0]]),
        frozen_lengths=torch.tensor([3, 4]),
        sequence_lengths=torch.tensor([4, 5]),
        wave_starts=torch.tensor([2, 3]),
        wave_widths=torch.tensor([1, 2]),
    )


def test_frame_and_frontier_of_known_tablets():
    frame = wavefront_frame(hand_made())
    assert frame["step"].tolist() == [0, 0, 1, 1, 1]
    assert frame["position"].tolist() == [2, 3, 2, 3, 4]
    assert frame["token"].tolist() == [7, 8, 7, 8, 9]
    assert frame["recurrence"].tolist() == [6, 2, 6, 4, 2]
    assert frame["frozen"].tolist() == [True, False, True, True, False]
    assert frame["in_wave"].tolist() == [True, False, False, True, True]
    assert len(wavefront_frame(hand_made(), include_prompt=True)) == 4 + 5
    front = frontier_frame(hand_made())
    assert front["newly_frozen"].tolist() == [0, 1]
    assert front["wave_end"].tolist() == [3, 5]
    fig = wavefront_heatmap(frame, front, token_text={7: "a"})
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float)
    assert z.shape == (2, 3) and z[1].tolist() == [6, 4, 2] and np.isnan(z[0, 2])
    assert heat.customdata[0][0] == "'a' (frozen)" and heat.customdata[0][1] == "'8' (guess)"
    assert list(fig.data[1].x) == [2.5, 3.5]  # frozen frontier between positions


def test_frame_of_a_real_run_and_bad_input():
    torch.manual_seed(0)
    cfg = RecurrentConfig(n_embd=32, n_heads=2, n_layers_in_prelude=1, n_layers_in_recurrent_block=2,
                          n_layers_in_coda=1, intermediate_size=64, vocab_size=64, block_size=128)  # fmt: skip
    model = RecurrentLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(2))
    out = generate_diffusion(model, ids, 6, num_steps=4, inner_recurrence=2, init_scale=0.0,
                             stop_tokens=(), return_details=True)  # fmt: skip
    frame = wavefront_frame(out)
    last = frame[frame["step"] == out.sampler_steps - 1].set_index("position")
    n = out.frozen.shape[1]
    assert last.loc[5 : n - 1, "frozen"].all()
    assert last.loc[5 : n - 1, "recurrence"].tolist() == out.recurrence_per_position[5:].tolist()
    # iterations grow by inner_recurrence exactly on the wave
    wave = frame[frame["in_wave"] & (frame["step"] > 0)]
    prev = frame.set_index(["step", "position"])["recurrence"]
    for step, pos, rec in wave[["step", "position", "recurrence"]].itertuples(index=False):
        assert rec - prev.get((step - 1, pos), 0) == 2
    bad = hand_made()
    bad.wave_widths = torch.tensor([1])
    with pytest.raises(ValueError, match="one per tablet row"):
        wavefront_frame(bad)
    with pytest.raises(ValueError, match="lacks columns"):
        wavefront_heatmap(frame.drop(columns="recurrence"), frontier_frame(out))
