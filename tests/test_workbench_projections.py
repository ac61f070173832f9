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


@pytest.mark.parametrize("shape", [(9, 20, 16), (3, 4, 5, 64), (2, 3, 200)])
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
    again, _ = wb.project(states, n_components=6)
    np.testing.assert_array_equal(coords, again)


def test_project_refuses_unknown_method():
    with pytest.raises(ValueError, match="pca"):
        wb.project(np.zeros((2, 3, 4)), method="tsne")


def test_importing_workbench_does_not_import_umap():
    code = "import sys, workbench, workbench.figures; print('umap' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
