"""Lenses: the coda lens is the model's own output; with no coda layers it equals the logit lens."""

import numpy as np
import pytest
import torch

import recurrent_model as rm
import workbench as wb

IDS = torch.arange(5, 14)


def _model(**overrides):
    torch.manual_seed(0)
    return rm.RecurrentLM(rm.preset("tiny", **overrides)).eval()


def test_coda_lens_last_step_is_the_model_output():
    model = _model()
    traj = wb.collect(model, IDS, 4, seeds=(2,), progress=False)
    frame = wb.lens(model, traj.raw_states[0], "coda", top_k=3, tokens=traj.tokens)
    assert len(frame) == 9 * 5 and set(frame.step) == set(range(5))
    out = model(IDS[None], num_steps=4, generator=torch.Generator().manual_seed(2))
    probs = torch.softmax(out.logits[0], -1)
    last = frame[frame.step == 4].sort_values("position")
    assert last.final_token.tolist() == [str(i) for i in probs.argmax(-1).tolist()]
    assert (last.final_rank == 1).all()
    np.testing.assert_allclose(last.final_prob, probs.max(-1).values.detach(), rtol=1e-5)
    np.testing.assert_allclose(last.kl_to_final, 0.0, atol=1e-6)
    np.testing.assert_allclose(last.entropy, -(probs * probs.log()).sum(-1).detach(), rtol=1e-5)
    top = np.stack(last.topk_probs)
    assert top.shape == (9, 3) and (np.diff(top, axis=1) <= 0).all()
    assert (frame.final_rank >= 1).all() and (frame.kl_to_final >= 0).all()


def test_coda_lens_equals_logit_lens_when_the_coda_is_the_identity():
    model = _model(n_layers_in_coda=0)
    traj = wb.collect(model, IDS, 3, progress=False)
    coda = wb.lens(model, traj.raw_states[0], "coda")
    logit = wb.lens(model, traj.raw_states[0], "logit")
    for col in ("final_rank", "final_prob", "kl_to_final", "entropy", "top1_token"):
        np.testing.assert_array_equal(coda[col].to_numpy(), logit[col].to_numpy())
    # ...and they differ once the coda has layers.
    model = _model()
    traj = wb.collect(model, IDS, 3, progress=False)
    assert not np.allclose(
        wb.lens(model, traj.raw_states[0], "coda").entropy,
        wb.lens(model, traj.raw_states[0], "logit").entropy,
    )


def test_sublayer_lens_rows_and_chunking():
    model = _model()
    sub = wb.collect_sublayers(model, IDS, 3)
    frame = wb.sublayer_lens(model, sub, "logit", top_k=2)
    assert len(frame) == 9 * 3 * 2
    assert set(frame.step) == {1, 2, 3} and set(frame.sublayer) == {0, 1}
    small = wb.lens(model, sub.reshape(6, 9, 64), "logit", top_k=2, chunk_bytes=1)
    big = wb.lens(model, sub.reshape(6, 9, 64), "logit", top_k=2)
    np.testing.assert_allclose(small.entropy, big.entropy, rtol=1e-6)
    with pytest.raises(ValueError, match="lens must be"):
        wb.lens(model, sub[0], "tuned")


def test_convergence_takes_kl_and_entropy_from_the_lens():
    model = _model()
    traj = wb.collect(model, IDS, 3, progress=False)
    frame = wb.lens(model, traj.raw_states[0], "coda")
    conv = wb.convergence(traj.states[0], lens_frame=frame)
    assert len(conv) == 9 * 4 and conv.kl_to_final.notna().all()
    row = conv[(conv.position == 4) & (conv.step == 1)].iloc[0]
    ref = frame[(frame.position == 4) & (frame.step == 1)].iloc[0]
    assert row.kl_to_final == ref.kl_to_final and row.entropy == ref.entropy
    with pytest.raises(ValueError, match="lens_frame has"):
        wb.convergence(traj.states[0, :2], lens_frame=frame)
