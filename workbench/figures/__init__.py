"""Plotly figure builders: each takes DataFrames / arrays and returns a ``plotly.graph_objects.Figure``."""

from .convergence import convergence_heatmap
from .curves import step_curves, steps_per_token_bars, token_correlation_curve
from .lens import lens_heatmap, lens_table
from .projection import pc_pair_panels, rotation_panel, waterfall_3d
from .seeds import seed_overlay, spread_curves

__all__ = [
    "convergence_heatmap",
    "lens_heatmap",
    "lens_table",
    "pc_pair_panels",
    "rotation_panel",
    "seed_overlay",
    "spread_curves",
    "step_curves",
    "steps_per_token_bars",
    "token_correlation_curve",
    "waterfall_3d",
]
