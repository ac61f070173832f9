"""Generated problems with known answers, shared by the training corpus (pretrain) and the analysis
(workbench, eval): graded arithmetic (``tasks.arithmetic``), tasks whose number of sequential steps
the generator controls (``tasks.depth``), and GSM8k-style word problems, counting and modular tasks
with worked answers (``tasks.reasoning``). Depends on nothing else in the project."""

from . import arithmetic, depth, reasoning

__all__ = ["arithmetic", "depth", "reasoning"]
