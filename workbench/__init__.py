"""workbench: collect latent trajectories of a recurrent-depth model and analyse them.

Data flows one way: model → hooks → ``Trajectory`` → analyzers (DataFrames / arrays) → figures.
"""

from ._frames import position_labels
from .collect import TrajectoryTooLarge, collect, collect_sublayers
from .convergence import convergence, steps_to_converge
from .dynamics import classify_dynamics
from .lenses import lens, sublayer_lens
from .path_independence import attractor_distance, path_independence
from .probes import ProbeResult, correctness_probe, iteration_probe, trajectory_features
from .projections import project
from .step_dynamics import step_dynamics
from .token_correlation import token_correlation
from .trajectory import Trajectory

__all__ = [
    "ProbeResult",
    "Trajectory",
    "TrajectoryTooLarge",
    "attractor_distance",
    "classify_dynamics",
    "collect",
    "collect_sublayers",
    "convergence",
    "correctness_probe",
    "iteration_probe",
    "lens",
    "path_independence",
    "position_labels",
    "project",
    "step_dynamics",
    "steps_to_converge",
    "sublayer_lens",
    "token_correlation",
    "trajectory_features",
]
