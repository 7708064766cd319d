"""The batch-system seam: :class:`BatchSystem` renders a job's script and drives its queue
from a system's class attributes (:class:`spillway.deploy.slurm.Slurm` is one); the
refusals every launcher that starts its own cluster shares (MPI's too)."""

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
