"""Linear probes on collected states, with held-out accuracy.

iteration_probe    predicts the iteration index i from a state z_i (is there a "counter"?); train and
                   test sets are disjoint token positions, so the probe must generalise across tokens.
correctness_probe  separates trajectories of correctly and incorrectly answered prompts from
                   per-trajectory features (see ``trajectory_features`` and ``workbench.arithmetic``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler


@dataclass
class ProbeResult:
    """Accuracy of a fitted linear probe on its training and held-out samples."""

    train_accuracy: float
    test_accuracy: float
    chance: float
    n_train: int
    n_test: int
    model: Pipeline = field(repr=False)
    extra: dict[str, float] = field(default_factory=dict)


def _probe(pca_dims: int | None, seed: int, c: float) -> Pipeline:
    steps: list[Any] = [StandardScaler()]
    if pca_dims is not None:
        steps.append(PCA(n_components=pca_dims, svd_solver="randomized", random_state=seed))
    steps.append(LogisticRegression(C=c, max_iter=2000, random_state=seed))
    return make_pipeline(*steps)


def _fit(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    pca_dims: int | None,
    seed: int,
    c: float,
) -> tuple[Pipeline, np.ndarray, float, float]:
    if pca_dims is not None:
        pca_dims = min(pca_dims, *x_train.shape)
    model = _probe(pca_dims, seed, c).fit(x_train, y_train)
    predicted = model.predict(x_test)
    train_acc = float((model.predict(x_train) == y_train).mean())
    return model, predicted, train_acc, float((predicted == y_test).mean())


def iteration_probe(
    states: np.ndarray,
    test_fraction: float = 0.25,
    seed: int = 0,
    pca_dims: int | None = 64,
    c: float = 1.0,
) -> ProbeResult:
    """Predict the step index from states (steps + 1, T, h) or (n_runs, steps + 1, T, h).

    Positions are split into train and test tokens (``test_fraction`` held out). ``extra`` holds
    ``mean_abs_step_error`` on the test tokens. ``pca_dims`` (None = off) reduces the standardised
    features first (seeded randomized PCA, fast at h = 5280); the probe stays linear.
    """
    z = np.asarray(states, dtype=np.float32)
    if z.ndim == 3:
        z = z[None]
    if z.ndim != 4:
        raise ValueError(
            f"states must be (steps + 1, T, h) or (runs, steps + 1, T, h), got {z.shape}"
        )
    _, n_steps, T, h = z.shape
    n_test = int(round(T * test_fraction))
    if T < 2 or not 0 < n_test < T:
        raise ValueError(f"cannot hold out {test_fraction:.0%} of {T} token positions")
    order = np.random.default_rng(seed).permutation(T)
    test_pos, train_pos = np.sort(order[:n_test]), np.sort(order[n_test:])

    def take(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        part = z[:, :, pos]  # (runs, steps, P, h)
        labels = np.broadcast_to(np.arange(n_steps)[None, :, None], part.shape[:3])
        return part.reshape(-1, h), labels.ravel()

    x_train, y_train = take(train_pos)
    x_test, y_test = take(test_pos)
    model, predicted, train_acc, test_acc = _fit(
        x_train, y_train, x_test, y_test, pca_dims, seed, c
    )
    return ProbeResult(
        train_acc,
        test_acc,
        1.0 / n_steps,
        len(y_train),
        len(y_test),
        model,
        {"mean_abs_step_error": float(np.abs(predicted - y_test).mean())},
    )


def correctness_probe(
    features: np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    test_fraction: float = 0.3,
    seed: int = 0,
    pca_dims: int | None = None,
    c: float = 1.0,
) -> ProbeResult:
    """Separate correct from incorrect trajectories: features (n, d), one bool label per row.

    A stratified ``test_fraction`` is held out; ``chance`` is the majority-class rate of the test set.
    """
    x = np.asarray(features, dtype=np.float32)
    y = np.asarray(correct, dtype=bool)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(
            f"features must be (n, d) with one label per row; got {x.shape}, {y.shape}"
        )
    counts = np.bincount(y.astype(int), minlength=2)
    if counts.min() < 2:
        raise ValueError(
            f"the probe needs at least 2 correct and 2 incorrect trajectories; got {counts[1]} "
            f"correct and {counts[0]} incorrect"
        )
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    model, _, train_acc, test_acc = _fit(x_train, y_train, x_test, y_test, pca_dims, seed, c)
    chance = float(max(y_test.mean(), 1 - y_test.mean()))
    return ProbeResult(train_acc, test_acc, chance, len(y_train), len(y_test), model)


def trajectory_features(
    states: np.ndarray, positions: Sequence[int] | None = None, steps: Sequence[int] = (-1,)
) -> np.ndarray:
    """One feature vector for a trajectory (steps + 1, T, h): for each of ``steps``, the mean state
    over ``positions`` (default all), concatenated — length len(steps) · h."""
    z = np.asarray(states, dtype=np.float32)
    if z.ndim != 3:
        raise ValueError(f"states must be (steps + 1, T, h), got shape {z.shape}")
    pos = list(range(z.shape[1])) if positions is None else list(positions)
    return np.concatenate([z[s, pos].mean(axis=0) for s in steps])
