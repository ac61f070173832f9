"""Exact, deterministic PCA that returns a fitted sklearn ``PCA``.

Few components of wide states (the published h = 5280): the covariance matrix (one BLAS product)
and its top eigenvectors by Lanczos iteration to machine precision (``scipy.sparse.linalg.eigsh``
with a fixed start vector) — no full eigendecomposition or SVD. Otherwise sklearn's exact solvers.
Signs follow sklearn's ``svd_flip`` rule (largest-magnitude loading positive), so the result equals
``PCA(svd_solver="full")`` on the same matrix up to floating-point error.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import eigsh
from sklearn.decomposition import PCA

LANCZOS_MIN_FEATURES = 256
LANCZOS_MAX_COMPONENTS = 64


def pca_solver(n_samples: int, n_features: int, n_components: int) -> str:
    """Which exact solver ``fit_pca`` uses: "lanczos", "covariance_eigh" or "full"."""
    if n_features >= LANCZOS_MIN_FEATURES and n_components <= min(
        LANCZOS_MAX_COMPONENTS, n_features // 4, n_samples // 4
    ):
        return "lanczos"
    return "covariance_eigh" if n_samples >= n_features else "full"


def _flip_signs(components: np.ndarray) -> np.ndarray:
    """sklearn's svd_flip(u_based_decision=False): each row's largest-magnitude entry positive."""
    rows = np.arange(components.shape[0])
    signs = np.sign(components[rows, np.abs(components).argmax(axis=1)])
    return components * np.where(signs == 0, 1, signs)[:, None]


def _lanczos_pca(x: np.ndarray, k: int) -> PCA:
    n, h = x.shape
    mean = x.mean(axis=0)
    centred = x - mean
    cov = (centred.T @ centred).astype(np.float64) / (n - 1)
    del centred
    v0 = np.random.default_rng(0).standard_normal(h)
    values, vectors = eigsh(cov, k=k, which="LA", v0=v0, tol=0)
    order = np.argsort(values)[::-1]
    values, vectors = np.clip(values[order], 0.0, None), vectors[:, order]
    total = float(np.trace(cov))
    pca = PCA(n_components=k, svd_solver="full")
    pca.components_ = _flip_signs(vectors.T).astype(x.dtype)
    pca.explained_variance_ = values.astype(x.dtype)
    pca.explained_variance_ratio_ = (values / total).astype(x.dtype)
    pca.singular_values_ = np.sqrt(values * (n - 1)).astype(x.dtype)
    pca.mean_ = mean
    pca.n_components_ = k
    pca.n_samples_ = n
    pca.n_features_in_ = h
    rest = min(n, h) - k
    pca.noise_variance_ = float((total - values.sum()) / rest) if rest > 0 else 0.0
    return pca


def fit_pca(x: np.ndarray, n_components: int) -> PCA:
    """A fitted sklearn ``PCA`` of the rows of x (n, h), exact and deterministic."""
    n, h = x.shape
    k = min(int(n_components), n, h)
    solver = pca_solver(n, h, k)
    if solver == "lanczos":
        return _lanczos_pca(x, k)
    return PCA(n_components=k, svd_solver=solver).fit(x)
