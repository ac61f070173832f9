"""workbench: collect latent trajectories of a recurrent-depth model and analyse them.

Data flows one way: model → hooks → ``Trajectory`` → analyzers (DataFrames / arrays) → figures.
"""

from ._frames import position_labels
from .ablation import AblationResult, ablate_subspace, project_out_hook, token_rotation_plane
from .checkpoint_series import checkpoint_series
from .collect import TrajectoryTooLarge, collect, collect_sublayers
from .convergence import convergence, relative_step_sizes, steps_to_converge
from .dynamics import classify_dynamics
from .exits import exit_and_convergence
from .explain_dynamics import explain_dynamics
from .fixed_point import FixedPointResult, fixed_point
from .lenses import lens, sublayer_lens
from .lyapunov import lyapunov_spectrum
from .patching import patch_states
from .path_independence import attractor_distance, path_independence
from .probes import ProbeResult, correctness_probe, iteration_probe, trajectory_features
from .projections import aligned_umap, project
from .spectrum import fixed_point_spectrum
from .steering import (
    SteeringEffect,
    add_vector_hook,
    difference_of_means,
    pca_direction,
    plane_vector,
    rotate_plane_hook,
    steered_generation,
    steering_effect,
    steering_sweep,
)
from .step_dynamics import step_dynamics
from .stretch_attribution import stretch_attribution
from .token_correlation import token_correlation
from .trajectory import Trajectory
from .wavefront import frontier_frame, wavefront_frame

__all__ = [
    "exit_and_convergence",
    "AblationResult",
    "FixedPointResult",
    "ProbeResult",
    "SteeringEffect",
    "Trajectory",
    "TrajectoryTooLarge",
    "ablate_subspace",
    "add_vector_hook",
    "attractor_distance",
    "checkpoint_series",
    "classify_dynamics",
    "collect",
    "collect_sublayers",
    "convergence",
    "correctness_probe",
    "difference_of_means",
    "explain_dynamics",
    "fixed_point",
    "fixed_point_spectrum",
    "frontier_frame",
    "iteration_probe",
    "lens",
    "lyapunov_spectrum",
    "patch_states",
    "path_independence",
    "pca_direction",
    "plane_vector",
    "position_labels",
    "project",
    "aligned_umap",
    "project_out_hook",
    "relative_step_sizes",
    "rotate_plane_hook",
    "steered_generation",
    "steering_effect",
    "steering_sweep",
    "step_dynamics",
    "steps_to_converge",
    "stretch_attribution",
    "sublayer_lens",
    "token_correlation",
    "token_rotation_plane",
    "trajectory_features",
    "wavefront_frame",
]
