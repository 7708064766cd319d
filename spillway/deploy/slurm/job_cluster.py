"""A cluster whose workers are Slurm jobs, for a notebook: dask-jobqueue's ``SLURMCluster``
(the scheduler in this process, one :class:`~.worker_job.SlurmWorkerJob` per node, sbatch
and scancel, ``scale(jobs=)``, ``adapt(minimum_jobs=, maximum_jobs=)``, ``job_script()``,
``close()``) with spillway's jobs, from the same options object and job settings as
``spillway slurm render``. :func:`spillway.slurm` (``spillway.clusters.slurm``) runs
workflows on it.

A job is one node: ``scale(jobs=N)`` asks for N nodes, each job's workers named after it
(``NAME-0``, ``NAME-1``, ... with several) so that scaling down retires a job's workers by
name before it is cancelled. The scheduler listens where the options say (loopback by
default, which only a Slurm whose nodes are this machine reaches: set ``host`` or
``interface`` to the login node's address on the compute nodes' network).

Before its first job, :meth:`SlurmJobCluster.check_ready` asks Slurm's commands whether
they answer here; a job sbatch refuses is dropped from the spec and said by
:meth:`SlurmJobCluster.take_refusals`.
"""

from __future__ import annotations

import dataclasses
import os

from dask_jobqueue.slurm import SLURMCluster

from spillway import upstream
from spillway.options.errors import OptionsError
from spillway.launch import DEATH_TIMEOUT_S, free_dashboard_address, scheduler_without_http, ucxx_installed
from spillway.options.settings import Options

from ..batch import JobSettings, JobStatus
from .slurm import Slurm
from .worker_job import SlurmWorkerJob


def scheduler_options(options: Options) -> dict:
    """The keywords of the scheduler this process runs, from the options: where it listens
    (its host or interface), its port and its dashboard (dask-jobqueue's default would serve
    the dashboard on every interface)."""
    where = {"interface": options.interface} if options.interface else {"host": options.host}
    dashboard = ({"dashboard_address": free_dashboard_address(options.dashboard_address)}
                 if options.dashboard_address
                 else {"dashboard_address": None, "dashboard": False})
    return {**where, "port": options.scheduler_port, **dashboard}


class SlurmJobCluster(SLURMCluster):
    """Workers of ``options`` in Slurm jobs of ``job`` (one node each, ``nodes`` 1)."""

    job_cls = SlurmWorkerJob

    def __init__(self, options: Options, job: JobSettings, *, system: Slurm | None = None, **kwargs):
        self.system = system or Slurm()
        if job.nodes != 1:
            raise OptionsError(f"nodes: {job.nodes}; each job of a Slurm cluster is one node (scale(jobs=N) "
                               "asks for N)")
        job = dataclasses.replace(job, output_dir=os.path.abspath(job.output_dir))
        layout = self.system.layout(options, job)
        if layout.protocol == "ucx" and not ucxx_installed():
            raise OptionsError("protocol: the jobs' workers talk ucx, and their scheduler runs in this process, "
                               "which has no distributed-ucxx: install it here (pip install 'spillway[ucx]', "
                               "or the cuda12/cuda13 extra), or set protocol tcp")
        # sbatch does not make the directory of the job's output, and a job whose output has
        # nowhere to go ends at once and says nothing
        try:
            os.makedirs(job.output_dir, exist_ok=True)
        except OSError as e:
            raise OptionsError(f"output-dir: cannot make {job.output_dir!r} ([Errno {e.errno}] {e.strerror})") \
                from None
        self.spillway_options, self.spillway_job, self.layout = options, job, layout
        self._ready = False
        quiet = {} if options.dashboard_address else {"scheduler_cls": scheduler_without_http()}
        # dask-jobqueue needs cores and memory to build its own header and command, which
        # the job replaces with spillway's; processes makes its worker names the job's
        super().__init__(
            spillway_options=options, spillway_job=job, name=job.job_name,
            processes=layout.workers_per_node,
            cores=max(layout.workers_per_node, (layout.cpus_per_task or 0),
                      layout.workers_per_node * options.threads_per_worker),
            memory="1 GiB", protocol=layout.protocol, security=options.dask_security,
            scheduler_options=scheduler_options(options), death_timeout=DEATH_TIMEOUT_S, **quiet, **kwargs)

    def check_ready(self) -> None:
        """Slurm's commands are here and answer (once per cluster): else one line naming the
        command and what it said, before any job is submitted."""
        if not self._ready:
            self.system.check_ready()
            self._ready = True

    def take_refusals(self) -> list[str]:
        """Why sbatch refused jobs submitted so far, one line each; those jobs leave the spec,
        so the cluster neither counts nor waits for them."""
        refused = {name: job.refusal for name, job in self.workers.items() if getattr(job, "refusal", None)}
        if refused:
            for name in refused:
                self.worker_spec.pop(name, None)
            upstream.bring_to_spec(self)
        return list(refused.values())

    def job_ids(self) -> dict[str, str]:
        """The Slurm job id of each job submitted, by its name in the worker spec."""
        return {name: job.job_id for name, job in self.workers.items() if getattr(job, "job_id", None)}

    def job_states(self) -> dict[str, JobStatus]:
        """What Slurm says of each job submitted (squeue, or sacct once it has left the queue)."""
        return {name: self.system.status(job_id) for name, job_id in self.job_ids().items()}

    def output_of(self, job_id: str) -> str:
        """The file a job's output (its workers' log) goes to."""
        return os.path.join(self.spillway_job.output_dir, f"spillway-{job_id}.out")

