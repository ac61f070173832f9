"""Generated problems with known answers, shared by the training corpus (pretrain) and the analysis
(workbench, eval): graded arithmetic (``tasks.arithmetic``) and tasks whose number of sequential steps
the generator controls (``tasks.depth``). Depends on nothing else in the project."""

from . import arithmetic, depth

__all__ = ["arithmetic", "depth"]
