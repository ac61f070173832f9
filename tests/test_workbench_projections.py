"""Projections: PCA equals sklearn's on the same matrix; UMAP stays lazy."""

import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.decomposition import PCA

import workbench as wb


def _low_rank(shape, rank=8, seed=0):
    rng = np.random.default_rng(seed)
    *lead, h = shape
    n = int(np.prod(lead))
    x = rng.normal(size=(n, rank)) * np.linspace(5, 1, rank) @ rng.normal(size=(rank, h))
    return (x + 0.01 * rng.normal(size=(n, h))).reshape(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(9, 20, 16), (3, 4, 5, 64), (2, 3, 200), (4, 250, 320)])
def test_pca_equals_sklearn_full_svd(shape):
    states = _low_rank(shape)
    coords, model = wb.project(states, n_components=6)
    flat = states.reshape(-1, shape[-1])
    reference = PCA(n_components=6, svd_solver="full").fit(flat)
    assert coords.shape == (*shape[:-1], 6)
    np.testing.assert_allclose(model.components_, reference.components_, atol=2e-4)
    scale = np.abs(reference.transform(flat)).max()
    np.testing.assert_allclose(coords.reshape(-1, 6), reference.transform(flat), atol=1e-4 * scale)
    np.testing.assert_allclose(
        model.explained_variance_ratio_, reference.explained_variance_ratio_, rtol=1e-4
    )
    np.testing.assert_allclose(model.noise_variance_, reference.noise_variance_, rtol=1e-3)
    again, _ = wb.project(states, n_components=6)
    np.testing.assert_array_equal(coords, again)


def test_wide_states_use_the_lanczos_solver():
    from workbench.pca import pca_solver

    assert pca_solver(65 * 512, 5280, 6) == "lanczos"
    assert pca_solver(4 * 250, 320, 6) == "lanczos"
    assert pca_solver(100, 64, 6) == "covariance_eigh" and pca_solver(6, 200, 6) == "full"


def test_project_refuses_unknown_method():
    with pytest.raises(ValueError, match="pca"):
        wb.project(np.zeros((2, 3, 4)), method="tsne")


def test_importing_workbench_does_not_import_umap():
    code = "import sys, workbench, workbench.figures; print('umap' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _FakeUMAP:
    """Stands in for umap.UMAP (whose import takes ~20 s): records what it was fitted on."""

    fits: list = []

    def __init__(self, n_components=2, random_state=None, **kwargs):
        self.n_components, self.kwargs = n_components, kwargs

    def fit_transform(self, x):
        _FakeUMAP.fits.append(x.shape)
        return x[:, : self.n_components] * 2


def test_umap_runs_on_pca_inputs_and_is_cached(monkeypatch):
    import types

    from workbench import projections

    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(UMAP=_FakeUMAP))
    projections.umap_cache_clear()
    _FakeUMAP.fits.clear()
    states = _low_rank((5, 30, 80))
    coords, reducer = wb.project(states, method="umap", n_components=2, pca_dims=10)
    assert coords.shape == (5, 30, 2) and isinstance(reducer, _FakeUMAP)
    assert _FakeUMAP.fits == [(150, 10)]  # fitted on the first 10 principal components
    pcs = wb.project(states, n_components=10)[0].reshape(-1, 10)
    np.testing.assert_allclose(coords.reshape(-1, 2), 2 * pcs[:, :2], rtol=1e-4, atol=1e-4)
    again, same = wb.project(states, method="umap", n_components=2, pca_dims=10)
    assert same is reducer and _FakeUMAP.fits == [(150, 10)]  # warm: served from the cache
    wb.project(states, method="umap", n_components=2, pca_dims=10, n_neighbors=5)
    assert len(_FakeUMAP.fits) == 2  # other parameters: a new fit
    projections.umap_cache_clear()


class _FakeAlignedUMAP:
    """Stands in for umap.AlignedUMAP: records its inputs; embeddings = 2 × the first columns."""

    fits: list = []

    def __init__(self, n_components=2, **kwargs):
        self.n_components, self.kwargs = n_components, kwargs

    def fit(self, slices, relations):
        _FakeAlignedUMAP.fits.append(([s.shape for s in slices], relations, self.kwargs))
        self.embeddings_ = [s[:, : self.n_components] * 2 for s in slices]
        return self


def test_aligned_umap_ties_steps_across_trajectories(monkeypatch):
    import types

    from workbench import projections

    monkeypatch.setitem(sys.modules, "umap", types.SimpleNamespace(AlignedUMAP=_FakeAlignedUMAP))
    projections.umap_cache_clear()
    _FakeAlignedUMAP.fits.clear()
    states = _low_rank((3, 12, 80))  # e.g. one token under 3 seeds, 12 states each
    trajs = [states[0], states[1], states[2, :9]]  # the last one shorter (another checkpoint)
    coords, reducer = wb.aligned_umap(trajs, pca_dims=10, n_neighbors=15)
    assert [c.shape for c in coords] == [(12, 2), (12, 2), (9, 2)]
    shapes, relations, kwargs = _FakeAlignedUMAP.fits[0]
    assert shapes == [(12, 10), (12, 10), (9, 10)]  # one PCA over all trajectories
    assert relations == [{i: i for i in range(12)}, {i: i for i in range(9)}]
    assert kwargs["n_neighbors"] == 8  # capped at the shortest trajectory - 1
    joint = wb.project(np.concatenate(trajs), n_components=10)[0]
    np.testing.assert_allclose(coords[2], 2 * joint[24:, :2], rtol=1e-4, atol=1e-4)
    again, same = wb.aligned_umap(trajs, pca_dims=10, n_neighbors=15)
    assert same is reducer and len(_FakeAlignedUMAP.fits) == 1  # cached
    with pytest.raises(ValueError, match="at least 2"):
        wb.aligned_umap(trajs[:1])
    with pytest.raises(ValueError, match="h="):
        wb.aligned_umap([states[0], states[1, :, :40]])
    projections.umap_cache_clear()


@pytest.mark.skipif(
    os.environ.get("WORKBENCH_REAL_UMAP") != "1",
    reason="real AlignedUMAP fit takes ~2 min on 2 shared cores (numba); WORKBENCH_REAL_UMAP=1",
)
def test_aligned_umap_real_embeddings_are_aligned():
    """Two noisy copies of one circle: aligned embeddings of matching steps lie close together."""
    rng = np.random.default_rng(0)
    angle = np.linspace(0, 2 * np.pi, 24, endpoint=False)
    base = np.stack([np.cos(angle), np.sin(angle)], 1) @ rng.standard_normal((2, 16))
    trajs = [base + 0.01 * rng.standard_normal(base.shape) for _ in range(2)]
    coords, _ = wb.aligned_umap(trajs, n_neighbors=8, n_epochs=100)
    gap = np.linalg.norm(coords[0] - coords[1], axis=1).mean()
    spread = np.linalg.norm(coords[0] - coords[0].mean(0), axis=1).mean()
    assert gap < 0.5 * spread


def test_editing_a_umap_result_leaves_the_cache_intact(monkeypatch):
    import types

    from workbench import projections

    fake = types.SimpleNamespace(UMAP=_FakeUMAP, AlignedUMAP=_FakeAlignedUMAP)
    monkeypatch.setitem(sys.modules, "umap", fake)
    projections.umap_cache_clear()
    states = _low_rank((4, 20, 30))
    first, _ = wb.project(states, method="umap", pca_dims=10)
    expected = first.copy()
    first[:] = 0.0  # a caller scribbles on its result
    second, _ = wb.project(states, method="umap", pca_dims=10)
    np.testing.assert_array_equal(second, expected)
    second[:] = 1.0  # a hit is a copy too
    np.testing.assert_array_equal(wb.project(states, method="umap", pca_dims=10)[0], expected)
    trajs = [states[0], states[1], states[2]]
    coords, _ = wb.aligned_umap(trajs, pca_dims=10)
    kept = [c.copy() for c in coords]
    coords[0][:] = 0.0
    for got, want in zip(wb.aligned_umap(trajs, pca_dims=10)[0], kept):
        np.testing.assert_array_equal(got, want)
    cached = [coords for coords, _ in projections._UMAP_CACHE.values()]
    assert not cached[0].flags.writeable and not any(c.flags.writeable for c in cached[1])
    projections.umap_cache_clear()
