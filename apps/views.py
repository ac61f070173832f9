"""The app's tabs in display order: one ``Tab`` record per ``apps/tab_*.py`` module.

The page (``apps/trajectories.py``), the browser helpers (``apps/serve.py``) and the tests iterate
``TABS``; nothing else names a tab. To add one, see "Add an app tab" in ``docs/contributing.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Tab:
    """One tab: its title, ``render(ctx)``, the label of the button or toggle that starts its heavy
    action (pressed by the screenshots so they show results; None when it has none) and the keys
    of the charts it draws on opening, before any action (what the tests check)."""

    title: str
    render: Callable[[Context], None]
    action: str | None = None
    charts: tuple[str, ...] = ()


TABS: list[Tab] = [
    Tab("Trajectories", tab_trajectories.render, charts=("pc_pairs", "waterfall")),
    Tab(
        "Convergence",
        tab_convergence.render,
        charts=("conv_heatmap", "step_curves", "token_corr"),
    ),
    Tab("Path independence", tab_path_independence.render, charts=("spread", "seed_overlay")),
    Tab("Dynamics", tab_dynamics.render, charts=("rotation", "dyn_pc_pairs")),
    Tab("Stability", tab_stability.render, action="Compute the stability of this token"),
    Tab("Lenses", tab_lenses.render, charts=("lens_heatmap", "lens_table")),
    Tab("Generation", tab_generation.render, action="Generate"),
    Tab("Wavefront", tab_wavefront.render, action="Sample"),
    Tab("Interventions", tab_interventions.render, action="Run patching"),
    Tab("Training", tab_training.render, action="Analyse these checkpoints"),
    Tab("Corpus", tab_corpus.render),
]


def titles(tabs: list[Tab] | None = None) -> list[str]:
    """The titles of ``tabs`` (default: TABS) in display order."""
    return [tab.title for tab in (TABS if tabs is None else tabs)]
