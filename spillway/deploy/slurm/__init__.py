"""Slurm batch analyses: a scheduler on the first node, one worker per GPU on every node,
the workflows run from the batch step and their reports written next to the job output.

:class:`Slurm` is Slurm on the batch seam (:mod:`spillway.deploy.batch`): ``job_script``
renders the sbatch script (a pure function), and a ``Slurm()`` submits, queries and
cancels jobs through Slurm's own commands. :mod:`.one_node` runs a one-node script
without Slurm.
"""

from ..batch import JobSettings, Layout, Run, format_walltime, parse_walltime, worker_lifetime
from .slurm import Slurm, SlurmError, job_script, layout

__all__ = ["JobSettings", "Layout", "Run", "Slurm", "SlurmError", "format_walltime", "job_script", "layout",
           "parse_walltime", "worker_lifetime"]
