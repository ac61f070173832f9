"""Projections: PCA equals sklearn's on the same matrix; UMAP stays lazy."""

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
