"""The batch-system seam, in the manner of dask-jobqueue's ``core.py``: :class:`BatchSystem`
renders a job's script (pure functions: :mod:`.script` and the ``job.sh.tmpl`` template)
and drives its queue from a system's class attributes; a system is one launcher module
beside the others (:class:`spillway.launch.slurm_batch.Slurm` is one). Also the refusals
every launcher that starts its own cluster shares (:func:`.refusals.refuse_options`,
MPI's too)."""

from .batch_system import BatchSystem
from .errors import BatchError, JobIdError
from .job_settings import JobSettings, format_walltime, parse_walltime, worker_lifetime
from .job_status import JobStatus
from .layout import Layout
from .refusals import refuse_options
from .run import Run
from .shell import Shell

__all__ = ["BatchError", "BatchSystem", "JobIdError", "JobSettings", "JobStatus", "Layout", "Run", "Shell",
           "format_walltime", "parse_walltime", "refuse_options", "worker_lifetime"]
