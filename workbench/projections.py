"""Projections of all states of a sequence: one PCA (default, deterministic) or UMAP.

UMAP is imported only inside ``project(..., method="umap")`` (its import alone takes many seconds) and its
results are cached in memory, keyed by the data and the parameters. The cache holds read-only
arrays and every call gets its own copy, so editing a result never changes a later one.
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


def _frozen(coords: np.ndarray | tuple[np.ndarray, ...]) -> Any:
    """The cached form: read-only arrays, so that nothing can edit a cached result in place."""
    arrays = coords if isinstance(coords, tuple) else (coords,)
    for a in arrays:
        a.setflags(write=False)
    return coords


def _copied(coords: np.ndarray | tuple[np.ndarray, ...]) -> Any:
    """What a caller gets: fresh writable copies, independent of the cache."""
    if isinstance(coords, tuple):
        return tuple(a.copy() for a in coords)
    return coords.copy()


def _remember(key: str, coords: Any, reducer: Any) -> None:
    """Cache one result (read-only) and evict the oldest beyond ``UMAP_CACHE_SIZE``."""
    _UMAP_CACHE[key] = (_frozen(coords), reducer)
    while len(_UMAP_CACHE) > UMAP_CACHE_SIZE:
        _UMAP_CACHE.popitem(last=False)


def _recall(key: str) -> tuple[Any, Any] | None:
    """A cached result as fresh copies and its reducer, or None."""
    if key not in _UMAP_CACHE:
        return None
    _UMAP_CACHE.move_to_end(key)
    coords, reducer = _UMAP_CACHE[key]
    return _copied(coords), reducer


def _umap(x: np.ndarray, n_components: int, pca_dims: int, random_state: int, **kwargs: Any):
    params = dict(n_components=n_components, pca_dims=pca_dims, random_state=random_state, **kwargs)
    key = _umap_key(x, params)
    hit = _recall(key)
    if hit is not None:
        return hit
    import umap  # lazy: a slow import

    reduced = fit_pca(x, pca_dims).transform(x) if x.shape[1] > pca_dims else x
    reducer = umap.UMAP(n_components=n_components, random_state=random_state, **kwargs)
    coords = reducer.fit_transform(reduced).astype(np.float32)
    _remember(key, coords.copy(), reducer)
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


def _slices(trajectories: Any) -> list[np.ndarray]:
    """Each trajectory as a float (n_i, h) array; they must share h."""
    slices = [np.asarray(t) for t in trajectories]
    if len(slices) < 2:
        raise ValueError(f"aligned UMAP needs at least 2 trajectories, got {len(slices)}")
    for i, s in enumerate(slices):
        if s.ndim != 2 or s.shape[0] < 3:
            raise ValueError(
                f"trajectory {i} must be (steps + 1, h) with >= 3 states, got {s.shape}"
            )
        if s.shape[1] != slices[0].shape[1]:
            raise ValueError(
                f"trajectory {i} has h={s.shape[1]}, trajectory 0 has h={slices[0].shape[1]}"
            )
    return [s.astype(np.float32) if s.dtype not in (np.float32, np.float64) else s for s in slices]


def aligned_umap(
    trajectories: Any,
    n_components: int = 2,
    *,
    pca_dims: int = 50,
    n_neighbors: int = 15,
    alignment_regularisation: float = 0.01,
    random_state: int = 0,
    **umap_kwargs: Any,
) -> tuple[list[np.ndarray], Any]:
    """One token's trajectories across seeds or checkpoints as aligned UMAP embeddings.

    trajectories: a sequence of (steps_k + 1, h) arrays (or one (n, steps + 1, h) array), e.g. one
    token's states under each seed, or under each checkpoint of a training run. All states are
    reduced by one PCA fitted over every trajectory (to `pca_dims`), then ``umap.AlignedUMAP``
    embeds each trajectory, tying step i of one to step i of the next (for the steps both have),
    so the embeddings share their layout and can be compared side by side. `n_neighbors` is capped
    at the shortest trajectory's length − 1. Returns (the embeddings, one (steps_k + 1,
    n_components) array per trajectory, and the fitted ``AlignedUMAP``); imported lazily and cached
    like `project(..., method="umap")`.
    """
    slices = _slices(trajectories)
    lengths = [len(s) for s in slices]
    n_neighbors = max(2, min(int(n_neighbors), min(lengths) - 1))
    params = dict(
        kind="aligned",
        n_components=n_components,
        pca_dims=pca_dims,
        n_neighbors=n_neighbors,
        alignment_regularisation=alignment_regularisation,
        random_state=random_state,
        lengths=tuple(lengths),
        **umap_kwargs,
    )
    stacked = np.concatenate(slices)
    key = _umap_key(stacked, params)
    hit = _recall(key)
    if hit is not None:
        return list(hit[0]), hit[1]
    import umap  # lazy: a slow import

    if stacked.shape[1] > pca_dims:
        stacked = fit_pca(stacked, pca_dims).transform(stacked)
    reduced = np.split(stacked, np.cumsum(lengths)[:-1])
    relations = [
        {i: i for i in range(min(a, b))} for a, b in zip(lengths[:-1], lengths[1:], strict=True)
    ]
    reducer = umap.AlignedUMAP(
        n_components=n_components,
        n_neighbors=n_neighbors,
        alignment_regularisation=alignment_regularisation,
        random_state=random_state,
        **umap_kwargs,
    ).fit(reduced, relations=relations)
    coords = tuple(np.array(e, dtype=np.float32) for e in reducer.embeddings_)
    _remember(key, _copied(coords), reducer)
    return list(coords), reducer
