"""Slurm batch analyses: a scheduler on the first node, one worker per GPU on every node,
the workflows run from the batch step and their reports written next to the job output.

``job_script`` renders the sbatch script (a pure function); :mod:`.queue` submits,
queries and cancels jobs through Slurm's own commands.
"""

from .job import JobSettings, format_walltime, parse_walltime, worker_lifetime
from .script import Layout, Run, job_script, layout

__all__ = ["JobSettings", "Layout", "Run", "format_walltime", "job_script", "layout", "parse_walltime",
           "worker_lifetime"]
