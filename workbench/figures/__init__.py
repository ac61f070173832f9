"""Plotly figure builders: each takes DataFrames / arrays and returns a ``plotly.graph_objects.Figure``."""

from ._style import VALUE_WORDS, words
from .aligned import aligned_embeddings_figure
from .convergence import convergence_heatmap
from .corpus import (
    convergence_steps_figure,
    kind_share_bars,
    lambda_quantiles_figure,
    period_histogram_figure,
)
from .curves import step_curves, steps_per_token_bars, token_correlation_curve
from .exits import exit_convergence_figure
from .interventions import ablation_control_figure, patching_heatmap, steering_sweep_figure
from .lens import lens_heatmap, lens_table
from .projection import pc_pair_panels, rotation_panel, waterfall_3d
from .seeds import ATTRACTOR_NOTE, seed_overlay, spread_curves
from .training import LOSS_NOTE, checkpoint_series_figure, loss_by_depth_figure
from .two_models import convergence_pair, joint_pca_pair, kinds_pair
from .wavefront import wavefront_heatmap

__all__ = [
    "ATTRACTOR_NOTE",
    "LOSS_NOTE",
    "VALUE_WORDS",
    "ablation_control_figure",
    "aligned_embeddings_figure",
    "checkpoint_series_figure",
    "convergence_heatmap",
    "convergence_pair",
    "convergence_steps_figure",
    "exit_convergence_figure",
    "joint_pca_pair",
    "kind_share_bars",
    "kinds_pair",
    "lambda_quantiles_figure",
    "lens_heatmap",
    "lens_table",
    "loss_by_depth_figure",
    "patching_heatmap",
    "pc_pair_panels",
    "period_histogram_figure",
    "rotation_panel",
    "seed_overlay",
    "spread_curves",
    "steering_sweep_figure",
    "step_curves",
    "steps_per_token_bars",
    "token_correlation_curve",
    "waterfall_3d",
    "wavefront_heatmap",
    "words",
]
