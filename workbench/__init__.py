"""workbench: collect latent trajectories of a recurrent-depth model and analyse them.

Data flows one way: model → hooks → ``Trajectory`` → analyzers (DataFrames / arrays) → figures.
"""

from .collect import TrajectoryTooLarge, collect, collect_sublayers
from .convergence import convergence, steps_to_converge
from .path_independence import attractor_distance, path_independence
from .projections import project
from .trajectory import Trajectory

__all__ = [
    "Trajectory",
    "TrajectoryTooLarge",
    "attractor_distance",
    "collect",
    "collect_sublayers",
    "convergence",
    "path_independence",
    "project",
    "steps_to_converge",
]
