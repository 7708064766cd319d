"""One interface for everything that starts spillway's workers: :class:`Backend`.

Every launcher takes what the core has already resolved (the :class:`~.plan.LaunchPlan`
and each GPU worker's :class:`~.spec.WorkerSpec`) and only renders it into its own
launcher's terms, in the manner of dask-jobqueue's ``Job`` and cubed's ``DagExecutor``:
the local GPU cluster (:class:`.local_gpu.LocalGPU`), the local CPU cluster
(:class:`.local_cpu.LocalCPU`), a running scheduler (:class:`Attach`), this node's
workers of ``spillway worker`` (:class:`.gpu_worker.NodeWorkers`) and a rank of an MPI
launch (``spillway.deploy.mpi.launch.MPIRank``).

The plans :func:`~.open_cluster` makes pick their backend by their kind
(:func:`backend_for`); ``spillway worker`` and ``spillway mpi`` name theirs.
"""

from __future__ import annotations

from typing import Any, Protocol

from spillway.options.settings import Options
from .plan import LaunchPlan
from .spec import WorkerSpec


class Backend(Protocol):
    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]) -> Any:
        """Start the workers of ``launch``, GPU workers as ``specs`` say (one per worker,
        in the plan's order; empty for CPU workers). ``options`` gives what is not a
        worker's: the scheduler's address, port, dashboard and TLS, the workers' dask
        config. Returns the cluster object a client connects to where this process holds
        one (the local clusters), else None once the workers are reachable elsewhere
        (attach) or, for a backend that serves in this process (a node's workers, an MPI
        rank), what it served."""
        ...


class Attach:
    """A running scheduler: nothing to start, the client connects to its address."""

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]) -> None:
        return None


def backend_for(kind: str) -> Backend:
    """The backend of the plans of ``kind`` (:attr:`LaunchPlan.kind`)."""
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(f"launch plan kind {kind!r}: no backend starts it ({', '.join(BACKENDS)})") from None


# imported at the end: the launchers' modules import nothing heavy at import (dask-cuda and
# distributed only when they start), and none of them imports this one
from .local_cpu import LocalCPU  # noqa: E402
from .local_gpu import LocalGPU  # noqa: E402

#: the backend of each kind of plan :func:`~.plan.plan` makes
BACKENDS: dict[str, Backend] = {"gpu": LocalGPU(), "cpu": LocalCPU(), "attach": Attach()}
