"""Every analysis on a tiny random model of each family (the ``family_model`` fixture: Huginn, Ouro,
retrofitted), with each family's own structure: its start (Ouro: the embedding, one run), its
normalisation (Ouro's states are normed already) and its step map."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import workbench as wb
from recurrent_model import hook_names
from workbench import corpus, figures
from workbench.core_map import model_maps
from workbench.corpus.analyses import Settings
from workbench.corpus.engine import Job
from workbench.lenses import lens

IDS = list(range(5, 17))
STEPS = 12


def deterministic(model) -> bool:
    return not model.random_initial_state


def test_the_forward_gives_logits_states_and_the_exit(family_model):
    ids = torch.tensor([IDS])
    with torch.no_grad():
        out, cache = family_model.run_with_cache(ids, num_steps=3, names_filter=hook_names.STATE)
    states = cache[hook_names.STATE]
    assert out.logits.shape == (1, len(IDS), family_model.config.vocab_size)
    assert out.logits.dtype == torch.float32 and states.shape[0] == 4
    torch.testing.assert_close(states[-1], out.state, rtol=0, atol=0)
    if family_model.family == "Ouro":
        assert out.exit_pdf.shape == (1, len(IDS), 3)
    else:
        assert out.exit_pdf is None


def test_the_cost_model_counts_every_parameter_and_projection(family_model):
    cost = family_model.config.cost
    assert cost.parameters == family_model.num_parameters()
    linears = {tuple(m.weight.shape) for m in family_model.modules()
               if isinstance(m, torch.nn.Linear) and m.weight.shape[0] > 1}  # fmt: skip
    assert linears == set(cost.weight_shapes().values())
    assert cost.forward_flops(8, 4) > cost.forward_flops(8, 2) > 0


def test_the_step_map_is_the_models_own_iteration(family_model):
    ids = torch.tensor([IDS])
    s0 = family_model.initial_state(torch.zeros(1, len(IDS), family_model.config.n_embd),
                                    1.0, torch.Generator().manual_seed(3))  # fmt: skip
    kwargs = {} if deterministic(family_model) else {"init_state": s0}
    with torch.no_grad():
        _, cache = family_model.run_with_cache(ids, num_steps=2, names_filter=hook_names.STATE,
                                               **kwargs)  # fmt: skip
    states = cache[hook_names.STATE][:, 0]
    step_map = model_maps(family_model, IDS)[0]
    torch.testing.assert_close(step_map(states[0]), states[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step_map(states[1]), states[2], rtol=1e-5, atol=1e-5)


def test_collect_classify_converge_project_and_lens(family_model):
    traj = wb.collect(family_model, IDS, STEPS, progress=False)
    assert traj.states.shape == (1, STEPS + 1, len(IDS), family_model.config.n_embd)
    if family_model.state_norm() is None:  # Ouro: the normalised view is the state itself
        assert traj.states is traj.raw_states
    kinds = wb.classify_dynamics(traj.states[0])
    assert len(kinds) == len(IDS) and kinds["kind"].notna().all()
    conv = wb.convergence(traj.states[0])
    assert len(conv) == (STEPS + 1) * len(IDS) and np.isfinite(conv["distance_to_final"]).all()
    coords, _ = wb.project(traj.states[0], "pca")
    assert coords.shape == (STEPS + 1, len(IDS), 2)
    for kind in ("coda", "logit"):
        frame = lens(family_model, traj.raw_states[0], kind)
        assert len(frame) == (STEPS + 1) * len(IDS) and (frame["kl_to_final"] > -1e-6).all()
    final = lens(family_model, traj.raw_states[0], "coda")
    assert final[final.step == STEPS]["kl_to_final"].abs().max() < 1e-5


def test_path_independence_needs_a_random_start(family_model):
    if deterministic(family_model):
        with pytest.raises(ValueError, match="starts every run from the embedding"):
            wb.collect(family_model, IDS, 8, seeds=(0, 1), progress=False)
        return
    traj = wb.collect(family_model, IDS, 8, seeds=(0, 1), progress=False)
    spread = wb.path_independence(traj.states)
    assert len(spread) == 9 * len(IDS) and (spread["spread"] >= 0).all()


def test_patching_every_position_at_the_last_step_restores_the_clean_run(family_model):
    corrupted = IDS[:-2] + [40, 41]
    frame = wb.patch_states(family_model, IDS, corrupted, 4, positions="all", metric="logit_diff")
    last = frame[frame["step"] == frame["step"].max()]
    np.testing.assert_allclose(last["restored"], 1.0, atol=1e-4)


def test_fixed_point_and_lyapunov_use_the_family_map(family_model):
    found = wb.fixed_point(family_model, IDS, tol=1e-4, max_iter=200)
    assert found.state.shape == (1, len(IDS), family_model.config.n_embd)
    assert torch.isfinite(found.residual).all()
    spectrum = wb.lyapunov_spectrum(family_model, IDS, 8, position=3, k=2)
    assert np.isfinite(spectrum["exponent"]).all()
    eigen = wb.fixed_point_spectrum(family_model, IDS, position=3, k=2, state=found.state)
    assert np.isfinite(eigen["modulus"]).all()


def test_generation_continues_the_prompt(family_model):
    ids = torch.tensor([IDS[:4]])
    with torch.no_grad():
        out = family_model.generate(ids, 3, num_steps=2, stop_tokens=())
    assert out.shape == (1, 7) and torch.equal(out[:, :4], ids)


def test_the_corpus_engine_runs_every_family(family_model, tmp_path):
    data = tmp_path / "p.txt"
    data.write_text("\n".join(" ".join(str(i) for i in IDS[k:]) for k in range(3)) + "\n")
    seeds = (0,) if deterministic(family_model) else (0, 1)
    settings = Settings(8, seeds, ("dynamics", "lens"), (1, 4))
    family_model.tokenizer = _IdsTokenizer()
    try:
        out = corpus.run(family_model, Job(str(data), settings, unit_tokens=16), tmp_path / "run",
                         progress=False)  # fmt: skip
    finally:
        family_model.tokenizer = None
    frame = corpus.load(out)
    assert len(frame) == len(seeds) * sum(len(IDS) - k for k in range(3))
    assert isinstance(frame, pd.DataFrame) and (frame["lens_kl_1"] >= 0).all()


class _IdsTokenizer:
    """Whitespace-separated integers as token ids, for a tiny model without a tokenizer."""

    stop_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def token_strings(self, ids: list[int]) -> list[str]:
        return [str(i) for i in ids]


def test_exit_against_convergence_per_token(family_model):
    frame = wb.exit_and_convergence(family_model, IDS, STEPS, threshold=0.5)
    assert len(frame) == len(IDS) and set(frame["label"]) <= {
        "fixed_point", "converging", "orbit", "slider", "other"}  # fmt: skip
    figure = figures.exit_convergence_figure(frame)
    if family_model.family == "Ouro":
        assert frame.attrs["learned_exit"] and frame["exit_step"].between(1, STEPS).all()
        assert frame["expected_exit"].between(1, STEPS).all()
        assert any("exit rule" in t.name for t in figure.data)
    else:
        assert frame["exit_step"].isna().all() and not frame.attrs["learned_exit"]
        assert figure.layout.annotations[0].text == "no learned exit in this family"


def test_steering_ablation_and_steered_generation(family_model):
    h = family_model.config.n_embd
    vector = torch.randn(h, generator=torch.Generator().manual_seed(0))
    sweep = wb.steering_sweep(family_model, IDS, 4, vector, (0.0, 4.0))
    assert sweep["kl"].iloc[0] == pytest.approx(0.0, abs=1e-6) and sweep["kl"].iloc[1] > 0
    ablated = wb.ablate_subspace(family_model, IDS, 12, position=5, n_random=4)
    assert np.isfinite(ablated.effect) and len(ablated.control) == 4
    hook = wb.add_vector_hook(vector, alpha=4.0)
    base, steered = wb.steered_generation(family_model, IDS[:4], 3, 2, [(hook_names.STATE, hook)])
    assert base.shape == steered.shape == (1, 7)
