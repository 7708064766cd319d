"""What a batch job starts, derived from the cluster options and the job settings."""

from __future__ import annotations

from dataclasses import dataclass

from spillway.options.errors import OptionsError
from spillway.options.settings import Options

from .. import commands
from .job_settings import JobSettings


@dataclass(frozen=True)
class Layout:
    """Workers and transport of a batch job."""

    kind: str  # "gpu" or "cpu"
    workers_per_node: int
    n_workers: int
    protocol: str
    #: CPUs of each node's worker task, or None for the batch system's default
    cpus_per_task: int | None = None

    @classmethod
    def of(cls, options: Options, job: JobSettings) -> Layout:
        """The job's workers; combinations that cannot work stop here (the options a
        batch system refuses outright are its own: :meth:`BatchSystem.layout`)."""
        if options.cpu:
            if job.gpus_per_node:
                raise OptionsError(f"gpus-per-node: {job.gpus_per_node} GPUs requested but cpu is true; use 0")
            total = options.n_workers or job.nodes
            if total % job.nodes:
                raise OptionsError(f"n-workers: {total} does not split evenly over {job.nodes} nodes")
            per_node = total // job.nodes
            return cls("cpu", per_node, total, commands.protocol(options, gpu=False, n_workers=total),
                       cpus_per_task=job.cpus_per_task)
        if not job.gpus_per_node:
            raise OptionsError("gpus-per-node: 0 GPUs gives no GPU workers; request GPUs or set cpu true")
        per_node = job.gpus_per_node * options.workers_per_gpu
        total = job.nodes * per_node
        if options.n_workers is not None and options.n_workers != total:
            raise OptionsError(
                f"n-workers: {options.n_workers} does not match {job.nodes} nodes x {job.gpus_per_node} GPUs "
                f"x {options.workers_per_gpu} worker(s) per GPU ({total}); leave it unset"
            )
        # a batch system's default may be one CPU per task (Slurm's is): too few for a
        # worker per GPU under task/cgroup
        cpus = job.cpus_per_task or per_node * (options.threads_per_worker + 1)
        return cls("gpu", per_node, total, commands.protocol(options, gpu=True, n_workers=total),
                   cpus_per_task=cpus)
