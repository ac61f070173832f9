"""The app's tabs in display order: (title, render function), one ``apps/tab_*.py`` module each.

To add a tab, write ``apps/tab_<name>.py`` with ``render(ctx: apps.ui.Context) -> None`` and add
it here; the page (``apps/trajectories.py``) draws the tabs in this order.
"""

from __future__ import annotations

from collections.abc import Callable

from . import (
    tab_convergence,
    tab_corpus,
    tab_dynamics,
    tab_generation,
    tab_interventions,
    tab_lenses,
    tab_path_independence,
    tab_stability,
    tab_training,
    tab_trajectories,
    tab_wavefront,
)
from .ui import Context

TABS: list[tuple[str, Callable[[Context], None]]] = [
    ("Trajectories", tab_trajectories.render),
    ("Convergence", tab_convergence.render),
    ("Path independence", tab_path_independence.render),
    ("Dynamics", tab_dynamics.render),
    ("Stability", tab_stability.render),
    ("Lenses", tab_lenses.render),
    ("Generation", tab_generation.render),
    ("Wavefront", tab_wavefront.render),
    ("Interventions", tab_interventions.render),
    ("Training", tab_training.render),
    ("Corpus", tab_corpus.render),
]
