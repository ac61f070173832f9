"""One functional layer core: every path computes bit-identical results; one-way imports; the
generation surface (GenerationConfig, typed returns, minp-kl, a cache that cannot fit)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import recurrent_model as rm
from recurrent_model import functional as fn
from recurrent_model import hook_names
from recurrent_model.generation import GenerationConfig, generate
from recurrent_model.sampling import ExitCriterion, minp_log_probs

PACKAGE = Path(rm.__file__).parent


@pytest.fixture(scope="module")
def perturbed_model() -> rm.RecurrentLM:
    """The tiny preset of seed 0 with its norms and q/k bias moved off their initial values."""
    torch.manual_seed(0)
    m = rm.RecurrentLM(rm.preset("tiny")).eval()
    with torch.no_grad():  # non-trivial norms and q/k bias, so that every weight matters
        for name, p in m.named_parameters():
            if "qk_bias" in name or ".norm_" in name or "ln_f" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return m


def ids(batch: int = 2, length: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 512, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_fast_cached_path_is_bit_identical_to_the_hooked_model_path(perturbed_model):
    kw = dict(num_steps=3, init_scale=0.0, stop_tokens=(), output_scores=True, return_details=True)
    fast = generate(perturbed_model, ids(), 6, **kw)
    with perturbed_model.hooks([(hook_names.STATE, lambda x, hook: None)]):
        assert perturbed_model.has_hooks()
        hooked = generate(perturbed_model, ids(), 6, **kw)
    assert not perturbed_model.has_hooks()
    assert torch.equal(fast.scores, hooked.scores)  # not close: the same ops on the same numbers
    assert torch.equal(fast.sequences, hooked.sequences)


def test_sandwich_block_equals_the_module_and_the_spec(perturbed_model):
    block = perturbed_model.transformer.core_block[1]
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    rope = perturbed_model.rope_at(0, 5)
    with torch.no_grad():
        got = fn.sandwich_block(x, block.weights(), rope, block.eps)
        assert torch.equal(got, block(x, rope))
        # the spec written out with torch ops: norm_2(x + Attn(norm_1 x)), norm_4(x + MLP(norm_3 x))
        mid = block.norm_2(x + block.attn(block.norm_1(x), rope))
        expected = block.norm_4(mid + block.mlp(block.norm_3(mid)))
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_trajectory_normalisation_is_the_models_ln_f(perturbed_model, dtype):
    from workbench.trajectory import rms_normalize

    raw = np.random.default_rng(0).standard_normal((3, 4, 64)).astype(dtype)
    weight = perturbed_model.transformer.ln_f.weight.detach()
    got = rms_normalize(raw, weight.numpy(), perturbed_model.config.norm_eps)
    with torch.no_grad():
        x = torch.from_numpy(raw)
        expected = fn.rms_norm(x, weight.to(x.dtype), perturbed_model.config.norm_eps).numpy()
        if dtype == np.float32:
            assert np.array_equal(got, perturbed_model.transformer.ln_f(x).numpy())
    assert np.array_equal(got, expected)
    x32 = raw.astype(np.float64)
    by_formula = x32 / np.sqrt((x32**2).mean(-1, keepdims=True) + 1e-6) * weight.double().numpy()
    np.testing.assert_allclose(got, by_formula, rtol=2e-3 if dtype == np.float16 else 1e-5)


def test_apply_rope_real_table_matches_complex_table():
    x = torch.randn(2, 3, 4, 8, generator=torch.Generator().manual_seed(0))
    table = fn.rope_table(8, 3, 10_000.0)
    torch.testing.assert_close(
        fn.apply_rope(x, torch.view_as_real(table)), fn.apply_rope(x, table), rtol=0, atol=1e-6
    )


def _module_imports(path: Path) -> set[str]:
    """Sibling modules a module imports anywhere (also inside functions), except for TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.level == 1:
                if sub.module:
                    found.add(sub.module.split(".")[0])
                else:
                    found.update(a.name for a in sub.names)
    return found


def test_recurrent_model_imports_point_one_way():
    graph = {p.stem: _module_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    # The one documented exception: RecurrentLM.save_pretrained delegates to checkpoint at call time.
    graph["model"].discard("checkpoint")
    assert "_hook_points" not in (PACKAGE / "cached_forward.py").read_text()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, dep]))
            if dep not in state:
                visit(dep, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_generation_config_and_keywords_are_one_surface(perturbed_model):
    cfg = GenerationConfig(num_steps=3, init_scale=0.0, stop_tokens=())
    by_config = generate(perturbed_model, ids(), 5, config=cfg)
    by_keywords = perturbed_model.generate(ids(), 5, num_steps=3, init_scale=0.0, stop_tokens=[])
    assert isinstance(by_config, torch.Tensor) and torch.equal(by_config, by_keywords)
    details = perturbed_model.generate(ids(), 5, config=cfg, num_steps=1, return_details=True)
    assert isinstance(details, rm.GenerationOutput)
    assert details.steps.unique().tolist() == [1]  # keywords override the config
    with pytest.raises(TypeError, match="unknown option.*num_step\\b"):
        perturbed_model.generate(ids(), 5, num_step=3)
    with pytest.raises(AttributeError):
        cfg.num_steps = 4  # type: ignore[misc]


def test_minp_kl_follows_the_published_definition():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    later = logits + 0.05 * torch.randn(3, 50, generator=torch.Generator().manual_seed(1))

    def published(lg: torch.Tensor) -> torch.Tensor:  # MinKLExitEvaluator._calc_minp_log_probs
        probs = F.softmax(lg, dim=-1)
        masked = probs.clone()
        masked[probs < 0.1 * probs.max(dim=-1, keepdim=True)[0]] = 1 / lg.shape[-1]
        return (masked / masked.sum(dim=-1, keepdim=True)).log()

    assert torch.allclose(minp_log_probs(logits), published(logits), atol=1e-6)
    uniform = torch.full((3, 50), -math.log(50))
    first = F.kl_div(published(logits), uniform, reduction="none", log_target=True).sum(-1)
    second = F.kl_div(published(later), published(logits), reduction="none", log_target=True)
    second = second.sum(-1)
    for values, step_logits in ((first, [logits]), (second, [logits, later])):
        for threshold, expected in ((values.max() * 1.01, True), (values.min() * 0.99, False)):
            crit = ExitCriterion("minp-kl", float(threshold))
            state = torch.zeros(3, 1, 4)
            for lg in step_logits:
                out = crit(state, state, lg)
            assert out.tolist() == [expected] * 3


def test_minp_kl_in_generate_exits_early_and_defaults(perturbed_model):
    assert ExitCriterion("minp-kl").threshold == 1e-5
    out = perturbed_model.generate(ids(), 4, num_steps=6, exit_criterion="minp-kl", exit_threshold=1e9,
                         init_scale=0.0, stop_tokens=(), return_details=True)  # fmt: skip
    assert out.steps.unique().tolist() == [1]


def test_a_cache_that_cannot_fit_fails_before_allocating(perturbed_model):
    with pytest.raises(rm.KVCacheTooLarge, match=r"needs [\d,]+ bytes .*cache_budget"):
        perturbed_model.generate(ids(), 4, num_steps=100_000_000)
    shape = rm.KVCache.shape_for(perturbed_model.config, 2, 10, 100_000_000, budget=8)
    assert shape[0] == 1 + 8 + 1  # with a budget the same request fits
