"""A GPU (or CPU) cluster on Slurm from a notebook: ``spillway.slurm(...)``, the notebook's
entry point of the launcher of Slurm jobs (:mod:`spillway.launch.slurm_jobs`).

The scheduler runs in this process; each Slurm job is one node's workers, submitted and
cancelled by dask-jobqueue (:func:`spillway.launch.slurm_jobs.open_jobs`) with the
``#SBATCH`` lines and worker command ``spillway slurm render`` writes, from the same
options object. The cluster offers what ``spillway.local()`` offers (runs, computes,
``open``, dask's Cluster verbs) plus ``scale(jobs=)``, ``adapt(minimum_jobs=,
maximum_jobs=)`` and ``job_script()``. Waiting for workers watches the jobs, so a job that
failed or pends for a reason Slurm gives is said in one line rather than timing out.

``scale`` and ``adapt`` first check that Slurm answers here (``sbatch --version``,
``sinfo``), and ``scale`` waits for sbatch to take its jobs: a missing command, a Slurm
without its controller or a refused job is one line at once, not a start timeout.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from time import monotonic, sleep

from spillway import upstream
from spillway.options.errors import ClusterStartError, OptionsError
from spillway.options.settings import Options

from spillway.clusters.base import Cluster, worker_count

#: seconds between two looks at the jobs while waiting for their workers
POLL_S = 1.0


def slurm(*, jobs: int = 0, gpus_per_node: int | None = None, time: str = "01:00:00", partition: str | None = None,
          account: str | None = None, qos: str | None = None, job_name: str | None = None,
          cpus_per_task: int | None = None, mem: str | None = None, output_dir: str = ".",
          directives: tuple[str, ...] = (), setup: tuple[str, ...] = (), python: str | None = None,
          start_timeout: int = 300, **option_keywords) -> SlurmCluster:
    """A cluster of Slurm jobs: ``slurm(gpus_per_node=4, time="02:00:00", partition="gpu",
    jobs=2)`` (``gpus_per_node`` 1 unless given), or ``slurm(cpu=True, n_workers=2, ...)``
    for jobs of CPU workers (``n_workers`` per job). The job settings are those of
    ``spillway slurm render`` (one node per job); every other keyword is a cluster option,
    as for ``spillway.local``. Bad settings raise
    :class:`~spillway.options.errors.OptionsError` before anything is submitted."""
    import sys

    from spillway.launch.slurm_batch import JobSettings

    options = Options.resolve(**option_keywords)
    if gpus_per_node is None:
        # one GPU, the smallest GPU job, which Slurm fits on any node with a GPU free; a
        # default rather than a refusal, so that where Slurm is missing the first line a
        # user reads (at scale) names it, the cause, and not a setting
        gpus_per_node = 0 if options.cpu else 1
    job = JobSettings(nodes=1, gpus_per_node=gpus_per_node, time=time, partition=partition, account=account, qos=qos,
                      # one name for all the cluster's jobs, its own: `squeue --name` finds them
                      job_name=job_name or f"spillway-{uuid.uuid4().hex[:8]}", cpus_per_task=cpus_per_task,
                      mem=mem, output_dir=output_dir, extra_directives=tuple(directives), setup=tuple(setup),
                      python=python or sys.executable, start_timeout=start_timeout)
    cluster = SlurmCluster(options, job)
    if jobs:
        try:
            cluster.scale(jobs=jobs)
        except BaseException:
            cluster.close()
            raise
    return cluster


class SlurmCluster(Cluster):
    """Workers in Slurm jobs of ``job`` (:class:`~spillway.launch.batch.JobSettings`, one
    node each), built from ``options``."""

    title = "spillway Slurm cluster"

    def __init__(self, options: Options, job):
        try:
            from spillway.launch.slurm_jobs import open_jobs
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(f"spillway.slurm needs {e.name}, which is not installed: "
                                      "pip install 'spillway[slurm]'", name=e.name) from None

        stack = contextlib.ExitStack()
        session = stack.enter_context(open_jobs(options, job))
        #: the cluster of Slurm jobs underneath (:class:`spillway.launch.slurm_jobs.SlurmJobCluster`)
        self.jobs = session.cluster
        super().__init__(session, stack)

    @property
    def workers_per_job(self) -> int:
        return self.jobs.layout.workers_per_node

    def job_script(self) -> str:
        """The script of one job, as sbatch gets it (its worker name a stand-in)."""
        return self.jobs.job_script()

    def scale(self, n: int | None = None, *, jobs: int | None = None) -> None:
        """Scale to ``jobs`` jobs, or to the jobs ``n`` workers take. The workers of a job
        that goes hand their data to the others first; then its job is cancelled. Ends
        adaptive scaling."""
        if (n is None) == (jobs is None):
            raise OptionsError("scale: give n (workers) or jobs, one of them")
        target = (math.ceil(worker_count(n, "scale") / self.workers_per_job) if n is not None
                  else worker_count(jobs, "jobs"))
        if target:
            self.jobs.check_ready()
        self._resize(target)
        # sbatch has answered for each new job when this returns
        upstream.bring_to_spec(self.jobs)
        self.jobs.raise_refusals()

    def adapt(self, minimum_jobs: int = 0, maximum_jobs: int | None = None, **adaptive):
        """Between ``minimum_jobs`` and ``maximum_jobs`` jobs with the work queued (dask's
        Adaptive, which retires a job's workers by name before its job is cancelled)."""
        minimum_jobs = worker_count(minimum_jobs, "minimum_jobs")
        if maximum_jobs is None:
            raise OptionsError("maximum_jobs: give the most jobs this cluster may submit at once")
        maximum_jobs = worker_count(maximum_jobs, "maximum_jobs")
        if minimum_jobs > maximum_jobs:
            raise OptionsError(f"minimum_jobs: {minimum_jobs} is above maximum_jobs {maximum_jobs}")
        if maximum_jobs:
            self.jobs.check_ready()
        return self.jobs.adapt(minimum_jobs=minimum_jobs, maximum_jobs=maximum_jobs, **adaptive)

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` workers are up, watching their jobs: a job that ended, or
        that Slurm keeps pending for a reason it gives, fails the wait in one line naming
        the job, its state, the reason and its output file."""
        n = worker_count(n, "wait_for_workers")
        timeout = self.jobs.spillway_job.start_timeout if timeout is None else timeout
        deadline = monotonic() + timeout
        while self.n_workers < n:
            states = self.jobs.check_jobs()
            if monotonic() > deadline:
                raise ClusterStartError(f"{self.n_workers} of {n} workers joined within {timeout:g} s: "
                                        f"{self.jobs.waiting_for(states)}")
            sleep(POLL_S)

    def _repr_html_(self) -> str:
        return super()._repr_html_().replace(
            "</table>", f"<tr><th style='text-align:left'>jobs</th><td>{len(self.jobs.worker_spec)} x "
                        f"{self.workers_per_job} worker(s)</td></tr></table>")
