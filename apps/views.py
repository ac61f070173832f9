"""The app's tabs in display order: one ``Tab`` record per ``apps/tab_*.py`` module.

The page (``apps/trajectories.py``), the browser helpers (``apps/serve.py``) and the tests iterate
``TABS``; nothing else names a tab. To add one, see "Add an app tab" in ``docs/contributing.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import (
    tab_bundle,
    tab_compare,
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


def _family(model) -> str:
    return getattr(model, "family", "Huginn")


def huginn_only(what: str) -> Callable[[object], str | None]:
    """A tab that only Huginn's layout serves: ``what`` says what it drives there."""

    def reason(model) -> str | None:
        if _family(model) == "Huginn":
            return None
        return (
            f"This tab {what}; it is not available for the {_family(model)} family (docs/model.md)."
        )

    return reason


def random_start_only(model) -> str | None:
    """Path independence compares runs from different s_0."""
    if getattr(model, "random_initial_state", True):
        return None
    return (
        f"{_family(model)} starts every run from the embedding (s_0 is not random), so there are "
        "no runs from different starts to compare."
    )


@dataclass(frozen=True)
class Tab:
    """One tab: its title, ``render(ctx)``, the label of the button or toggle that starts its heavy
    action (pressed by the screenshots so they show results; None when it has none), the keys
    of the charts it draws on opening, before any action (what the tests check), and
    ``unavailable(model)``: the one line shown instead of the tab for a family it does not serve."""

    title: str
    render: Callable[[Context], None]
    action: str | None = None
    charts: tuple[str, ...] = ()
    unavailable: Callable[[object], str | None] = lambda model: None


TABS: list[Tab] = [
    Tab("Trajectories", tab_trajectories.render, charts=("pc_pairs", "waterfall")),
    Tab(
        "Convergence",
        tab_convergence.render,
        charts=("conv_heatmap", "step_curves", "token_corr"),
    ),
    Tab(
        "Path independence",
        tab_path_independence.render,
        charts=("spread", "seed_overlay"),
        unavailable=random_start_only,
    ),
    Tab("Dynamics", tab_dynamics.render, charts=("rotation", "dyn_pc_pairs")),
    Tab("Stability", tab_stability.render, action="Compute the stability of this token"),
    Tab("Lenses", tab_lenses.render, charts=("lens_heatmap", "lens_table")),
    Tab(
        "Generation",
        tab_generation.render,
        action="Generate",
        unavailable=huginn_only(
            "drives Huginn's generation options (per-iteration exits, cache "
            "budgets, drafts, the compiled decode); call model.generate"
        ),
    ),
    Tab(
        "Wavefront",
        tab_wavefront.render,
        action="Sample",
        unavailable=huginn_only(
            "runs the diffusion-forcing sampler, which iterates Huginn's core "
            "over a wave of positions"
        ),
    ),
    Tab("Interventions", tab_interventions.render, action="Run patching"),
    Tab(
        "Training",
        tab_training.render,
        action="Analyse these checkpoints",
        unavailable=huginn_only(
            "follows this project's training runs, which train Huginn's layout"
        ),
    ),
    Tab("Corpus", tab_corpus.render),
    Tab("Compare", tab_compare.render),
    Tab("Bundle", tab_bundle.render, action=tab_bundle.WRITE),
]


def titles(tabs: list[Tab] | None = None) -> list[str]:
    """The titles of ``tabs`` (default: TABS) in display order."""
    return [tab.title for tab in (TABS if tabs is None else tabs)]
