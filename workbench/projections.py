"""Projections of all states of a sequence: one PCA (default, deterministic) or UMAP.

UMAP is imported only inside ``project(..., method="umap")`` (its import alone takes ~20 s) and its
results are cached in memory, keyed by the data and the parameters.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np

from .pca import fit_pca

_UMAP_CACHE: OrderedDict[str, tuple[np.ndarray, Any]] = OrderedDict()
UMAP_CACHE_SIZE = 8


def _flatten(states: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    arr = np.asarray(states)
    if arr.ndim < 2:
        raise ValueError(f"states must be (..., h) with at least 2 axes, got shape {arr.shape}")
    x = arr.reshape(-1, arr.shape[-1])
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)
    return x, arr.shape[:-1]


def _umap_key(x: np.ndarray, params: dict[str, Any]) -> str:
    h = hashlib.sha1(np.ascontiguousarray(x).view(np.uint8).data)
    h.update(repr((x.shape, x.dtype.str, sorted(params.items()))).encode())
    return h.hexdigest()


def umap_cache_clear() -> None:
    """Forget every cached UMAP result."""
    _UMAP_CACHE.clear()


def _umap(x: np.ndarray, n_components: int, pca_dims: int, random_state: int, **kwargs: Any):
    params = dict(n_components=n_components, pca_dims=pca_dims, random_state=random_state, **kwargs)
    key = _umap_key(x, params)
    if key in _UMAP_CACHE:
        _UMAP_CACHE.move_to_end(key)
        return _UMAP_CACHE[key]
    import umap  # lazy: ~20 s import

    reduced = fit_pca(x, pca_dims).transform(x) if x.shape[1] > pca_dims else x
    reducer = umap.UMAP(n_components=n_components, random_state=random_state, **kwargs)
    coords = reducer.fit_transform(reduced).astype(np.float32)
    _UMAP_CACHE[key] = (coords, reducer)
    while len(_UMAP_CACHE) > UMAP_CACHE_SIZE:
        _UMAP_CACHE.popitem(last=False)
    return coords, reducer


def project(
    states: np.ndarray,
    method: str = "pca",
    n_components: int = 2,
    *,
    pca_dims: int = 50,
    random_state: int = 0,
    **umap_kwargs: Any,
) -> tuple[np.ndarray, Any]:
    """Fit one projection over every state (all steps, tokens and seeds) and project them.

    states: (..., h), e.g. (steps + 1, T, h) or (n_seeds, steps + 1, T, h). Returns (coords of shape
    (..., n_components), fitted model): a sklearn ``PCA`` (``explained_variance_ratio_``) or a
    ``umap.UMAP`` fitted on the first ``pca_dims`` principal components (cached per input).
    """
    x, lead = _flatten(states)
    if method == "pca":
        model = fit_pca(x, n_components)
        coords = model.transform(x)
    elif method == "umap":
        coords, model = _umap(x, n_components, pca_dims, random_state, **umap_kwargs)
    else:
        raise ValueError(f"method must be 'pca' or 'umap', got {method!r}")
    return coords.reshape(*lead, coords.shape[-1]), model
