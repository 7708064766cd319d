"""One interface for everything that starts spillway's workers: :class:`Backend`.

Every launcher is one module of this package with one backend: it takes what the core has
already resolved (the :class:`~.plan.LaunchPlan` and each GPU worker's
:class:`~.spec.WorkerSpec`) and only renders it into its own launcher's terms, in the
manner of dask-jobqueue's ``Job`` and distributed's ``deploy/`` cluster managers:

- the local GPU cluster (:class:`.local_gpu.LocalGPU`) and the local CPU cluster
  (:class:`.local_cpu.LocalCPU`);
- a running scheduler (:class:`.attach.Attach`);
- this node's workers of ``spillway worker`` (:class:`.gpu_worker.NodeWorkers`);
- a rank of an MPI launch (:class:`.mpi.MPIRank`);
- a Slurm batch job of workflows (:class:`.slurm_batch.SlurmBatch`) and a notebook's
  cluster of Slurm jobs (:class:`.slurm_jobs.SlurmJobs`, dask-jobqueue's).

The plans :func:`~.session.open_cluster` makes pick their backend by their kind
(:data:`BACKENDS`, :func:`backend_for`); the other launchers take what is theirs beyond
the options (the work, the job settings) when they are made, and their entry points
(``spillway worker``, ``spillway mpi``, ``spillway slurm``, ``spillway.slurm()``) name
them through the function of their module (:func:`.gpu_worker.run_node`,
:func:`.mpi.run`, :func:`.slurm_batch.submit`, :func:`.slurm_jobs.open_jobs`).
"""

from __future__ import annotations

from typing import Any, Protocol

from spillway.options.settings import Options
from .plan import LaunchPlan
from .spec import WorkerSpec


class Backend(Protocol):
    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]) -> Any:
        """Start the workers of ``launch``, GPU workers as ``specs`` say (one per worker,
        in the plan's order; empty for CPU workers, and where the nodes resolve their own:
        batch jobs). ``options`` gives what is not a worker's: the scheduler's address,
        port, dashboard and TLS, the workers' dask config. Returns the cluster object a
        client connects to where this process holds one (the local clusters, a cluster of
        Slurm jobs), else None once the workers are reachable elsewhere (attach); for a
        backend that serves in this process (a node's workers, an MPI rank), what it
        served; for a batch job, its job id."""
        ...


def backend_for(kind: str) -> Backend:
    """The backend of the plans of ``kind`` (:attr:`LaunchPlan.kind`)."""
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(f"launch plan kind {kind!r}: no backend starts it ({', '.join(BACKENDS)})") from None


# imported at the end: the launchers' modules import nothing heavy at import (dask-cuda and
# distributed only when they start), and none of them imports this one
from .attach import Attach  # noqa: E402
from .local_cpu import LocalCPU  # noqa: E402
from .local_gpu import LocalGPU  # noqa: E402

#: the backend of each kind of plan :func:`~.plan.plan` makes
BACKENDS: dict[str, Backend] = {"gpu": LocalGPU(), "cpu": LocalCPU(), "attach": Attach()}
