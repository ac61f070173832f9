"""Stability analyses on checkpoints/default: the methods agree with each other and with the model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import recurrent_model as rm
import workbench
from recurrent_model.threads import single_thread
from workbench.core_map import CoreMap, initial_state, iterate
from workbench.stretch_attribution import stretch_attribution

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "default"
PROMPT = "Claire makes a 3 egg omelet every morning"
SETTLED = 4  # a token whose trajectory settles on a fixed point


@pytest.fixture(scope="module", autouse=True)
def analyses_on_one_thread() -> Iterator[None]:
    """The analyses here run on one thread."""
    with single_thread(True):
        yield


@pytest.fixture(scope="module")
def ids(shipped_model):
    return shipped_model.tokenizer.encode(PROMPT)[:8]


@pytest.fixture(scope="module")
def whole(shipped_model, ids):
    return workbench.fixed_point(shipped_model, ids, tol=1e-6, max_iter=200)


def test_core_map_is_the_models_iteration(shipped_model, ids):
    core = CoreMap.from_model(shipped_model, ids)
    s0 = initial_state(shipped_model, core, 1.0, seed=3)
    x = torch.tensor([ids])
    with torch.no_grad():
        e = shipped_model.prelude(shipped_model.embed(x), shipped_model.rope_at(0, len(ids)))
        expected = shipped_model.core_step(s0[None], e, shipped_model.rope_at(0, len(ids)), 1)[0]
    assert torch.allclose(core(s0), expected, atol=1e-5, rtol=1e-5)
    block = core.block(5, s0)
    assert torch.allclose(block(s0[5]), expected[5], atol=1e-5, rtol=1e-5)


def test_anderson_reaches_128_plain_iterations_in_fewer_passes(shipped_model, ids, whole):
    core = CoreMap.from_model(shipped_model, ids)
    plain = iterate(core, initial_state(shipped_model, core, 0.0, 0), 128)[-1]
    found = whole.state[0]
    assert whole.converged and float(whole.residual.max()) < 1e-6
    assert float((found - plain).norm() / plain.norm()) < 1e-4
    assert whole.iterations < 128
    print(
        f"Anderson: {whole.iterations} core passes; plain iteration to 1e-6: {whole.plain_iterations}"
    )


def power_iteration_modulus(f, point: torch.Tensor, steps: int = 150) -> float:
    """Geometric mean of the growth of a finite-difference power iteration over its last half."""
    v = torch.randn(point.shape, generator=torch.Generator().manual_seed(0), dtype=point.dtype)
    v, eps, logs = v / v.norm(), 1e-2 * float(point.norm()), []
    with torch.no_grad():
        for _ in range(steps):
            image = (f(point + eps * v) - f(point - eps * v)) / (2 * eps)
            logs.append(float(image.norm().log()))
            v = image / image.norm()
    return float(np.exp(np.mean(logs[steps // 2 :])))


def test_power_iteration_agrees_with_arnoldi_and_lyapunov(shipped_model, ids, whole):
    state = whole.state
    spectrum = workbench.fixed_point_spectrum(
        shipped_model, ids, position=SETTLED, state=state, k=6
    )
    rho = float(spectrum["modulus"].iloc[0])
    assert spectrum.attrs["residual"] < 1e-5 and rho < 1
    core = CoreMap.from_model(shipped_model, ids)
    power = power_iteration_modulus(core.block(SETTLED, state[0]), state[0, SETTLED])
    assert power == pytest.approx(rho, rel=0.02)
    lyap = workbench.lyapunov_spectrum(
        shipped_model, ids, 60, position=SETTLED, k=1, warmup=20, state=state
    )
    assert float(lyap["exponent"].iloc[0]) == pytest.approx(np.log(rho), abs=0.02)
    print(
        f"|λ|max Arnoldi {rho:.4f}, power iteration {power:.4f}, exp(λ_1) {np.exp(lyap['exponent'].iloc[0]):.4f}"
    )


def test_attribution_splits_the_blocks_stretch(shipped_model, ids, whole):
    frame = stretch_attribution(shipped_model, ids, position=SETTLED, num_steps=24)
    names = ["adapter", "core.0.attn", "core.0.mlp", "core.1.attn", "core.1.mlp"]
    assert (
        list(frame["sublayer"]) == names[: 1 + 2 * shipped_model.config.n_layers_in_recurrent_block]
    )
    direction = torch.zeros(shipped_model.config.n_embd)
    direction[0] = 1.0
    at = stretch_attribution(
        shipped_model, ids, position=SETTLED, state=whole.state, direction=direction
    )
    core = CoreMap.from_model(shipped_model, ids)
    block = core.block(SETTLED, whole.state[0])
    image = torch.func.jvp(block, (whole.state[0, SETTLED],), (direction,))[1]
    assert at.attrs["total"] == pytest.approx(float(image.norm().log()), abs=1e-4)


def test_explain_dynamics_reports_every_requested_token(shipped_model, ids):
    frame = workbench.explain_dynamics(
        shipped_model, ids, 32, k=4, kinds=("fixed_point", "orbit", "slider", "other")
    )
    assert list(frame["position"]) == list(range(len(ids)))
    assert frame["fixed_point_found"].all() and (frame["spectral_radius"] < 1).all()
    assert set(frame["mechanism"]) <= {"stable", "flip", "rotation", "slider", "unstable", "driven"}


@pytest.mark.slow
def test_an_early_checkpoints_flip_sits_on_an_unstable_fixed_point():
    early = CHECKPOINT / "series" / "step-0000300"
    if not (early / "config.json").is_file():
        pytest.skip("checkpoints/default/series is not present")
    model = rm.load_model(early).float().eval()  # stored in bfloat16; analysed in float32
    ids = model.tokenizer.encode("def clamp(value, low, high):")[:13]
    frame = workbench.explain_dynamics(model, ids, 128, k=4).set_index("position")
    source = frame.loc[10]  # the first flipping token
    assert source["kind"] == "orbit" and source["flip"] and source["mechanism"] == "flip"
    assert source["fixed_point_found"] and not source["stable"] and source["eig_real"] < -1
    assert (frame.loc[11:, "mechanism"] == "driven").all()
    print(f"token 10 flips around an unstable fixed point, eigenvalue {source['eig_real']:.3f}")


def test_bad_input_is_a_clear_error(shipped_model, ids):
    h = shipped_model.config.n_embd
    with pytest.raises(IndexError, match="out of range for a prompt of 8 tokens"):
        workbench.fixed_point(shipped_model, ids, position=8)
    with pytest.raises(ValueError, match=f"larger than the dimension of the map \\(h = {h}\\)"):
        workbench.fixed_point_spectrum(shipped_model, ids, position=0, k=h + 1)
    with pytest.raises(ValueError, match="state has shape"):
        workbench.fixed_point(shipped_model, ids, state=torch.zeros(1, 7, h))
    bad = torch.zeros(1, 8, h)
    bad[0, 2, 3] = float("inf")
    with pytest.raises(ValueError, match="NaN or infinite"):
        workbench.lyapunov_spectrum(shipped_model, ids, 4, state=bad)
    stuck = workbench.fixed_point(shipped_model, ids, max_iter=2, plain_baseline=False)
    assert stuck.converged is False and stuck.iterations == 2


DOCSTRING = (
    "random_sample        Alias for `random_sample`\n"
    "randint              Uniformly distributed integers in a given range\n"
)


def test_the_docstring_source_token_is_a_neutral_rotation(shipped_model):
    ids = shipped_model.tokenizer.encode(DOCSTRING)[
        :7
    ]  # causal: the first 7 tokens move as in the whole
    frame = workbench.explain_dynamics(shipped_model, ids, 128, k=4).set_index("position")
    source = frame.loc[5]
    assert source["mechanism"] == "rotation" and source["neutral"]
    assert abs(source["lambda_1"]) <= 2 * source["lambda_1_stderr"]
    assert "invariant circle" in source["note"] and "±" in source["note"]
    assert frame.loc[6, "mechanism"] == "driven" and np.isnan(frame.loc[6, "lambda_1"])
    print(source["note"])
