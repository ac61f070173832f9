"""Where a process runs and how a job is launched: the process's rank and device
(``cluster.context``), the torchrun relaunch (``cluster.torchrun``), SLURM's rank variables
(``cluster.slurm``), the pieces of a job script (``cluster.job_script``), the cluster section of a
config file (``cluster.config``), the Frontier / ROCm environment (``cluster.rocm``) and NCCL's
flight recorder (``cluster.flight_recorder``).

Below both pretraining and the analyses: it imports no other part of the project.
"""
