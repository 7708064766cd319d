"""The MPI launcher (``spillway mpi``): a cluster of MPI ranks through dask-mpi's
``execute``, rank 0 running the scheduler and the work, every other rank one worker (one
GPU each).

Every rank calls :func:`run`. Rank 0 starts the scheduler and, in a thread, the client
that waits for all workers and runs the work on the cluster session; the other ranks each
start one worker (dask-cuda's ``CUDAWorker`` on one GPU, given spillway's tiered store
where the options choose it, or a CPU worker) and block until rank 0 closes the cluster.
Only rank 0 returns the work's result. :class:`MPIRank` is the rank's backend.

The decisions are pure functions of their arguments (which GPU a rank takes,
:func:`device_for_rank`; dask-mpi's keywords, :func:`execute_kwargs`); mpi4py and dask-mpi
(the ``mpi`` extra) are imported only when a rank runs. The work is passed in (``spillway
mpi`` passes a workflow's run): the launcher starts clusters from the specs and knows
nothing of what runs on them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import dask.config

from spillway.options.errors import OptionsError
from spillway.options.settings import Options

from . import commands
from .batch import refuse_options
from .gpu_worker import TIERED_WORKER, node_plan
from .plan import HostProbe, LaunchPlan, uses_tiered_store
from .render import dask_cuda_kwargs, store_data
from .spec import WorkerSpec, off_node_spec, one_for_all, worker_specs
from .ucx_env import quiet_ucx
from .worker_config import worker_config

#: the rank that runs the scheduler and the workflow (dask-mpi's client rank as well)
SCHEDULER_RANK = 0


def check_world(size: int) -> int:
    """Workers in a world of ``size`` ranks: all but the scheduler's."""
    if size < 2:
        raise OptionsError(
            f"mpi: {size} rank(s) leave no rank for a worker; start at least 2 "
            "(rank 0 runs the scheduler, each other rank one worker)"
        )
    return size - 1


def device_for_rank(rank: int, node_ranks: Sequence[int], devices: Sequence[int | str],
                    workers_per_gpu: int = 1) -> int | str:
    """The GPU of worker ``rank``: its place among the worker ranks of its node picks one
    of the node's ``devices``, ``workers_per_gpu`` neighbouring ranks to a GPU, so no GPU
    has more than that many."""
    workers = sorted(r for r in node_ranks if r != SCHEDULER_RANK)
    place = workers.index(rank) // workers_per_gpu
    if place >= len(devices):
        per_gpu = "one rank" if workers_per_gpu == 1 else f"{workers_per_gpu} ranks (workers-per-gpu)"
        raise OptionsError(
            f"mpi: rank {rank} is worker {workers.index(rank) + 1} on its node but the node has {len(devices)} "
            f"GPU(s); start {per_gpu} per GPU (plus one for the scheduler on the first node)"
        )
    return devices[place]


def worker_class(options: Options) -> str:
    if options.cpu:
        return "distributed.Nanny"
    return TIERED_WORKER if uses_tiered_store(options) else "dask_cuda.CUDAWorker"


def worker_options(spec: WorkerSpec | None) -> dict:
    """Keywords of each rank's worker beyond those dask-mpi passes itself (interface,
    protocol, threads, host memory limit, local directory, name: :func:`execute_kwargs`
    gives those from the same spec); none for CPU workers (``spec`` None)."""
    if spec is None:
        return {}
    out = dask_cuda_kwargs(spec)
    for key in _PASSED_BY_DASK_MPI:
        out.pop(key, None)
    return out


#: the worker keywords dask-mpi's ``execute`` takes as its own arguments
_PASSED_BY_DASK_MPI = ("protocol", "memory_limit", "local_directory")


def execute_kwargs(options: Options, *, n_workers: int, spec: WorkerSpec | None = None) -> dict:
    """Keywords of ``dask_mpi.execute`` for ``options`` (the client function aside). A GPU
    worker rank passes its ``spec`` (resolved on its node, with the tiered store's
    ``data``); without one the worker settings are those known off the node (a rank's
    one GPU, its node's memory unknown)."""
    protocol = commands.protocol(options, gpu=not options.cpu, n_workers=n_workers)
    on_node = spec is not None
    if not options.cpu and spec is None:
        spec = off_node_spec(options, protocol=protocol, workers=1)
    workers = worker_options(spec)
    if on_node and spec.tiered:
        workers["data"] = store_data(spec)
    return dict(
        client_rank=SCHEDULER_RANK,
        scheduler_rank=SCHEDULER_RANK,
        exclusive_workers=True,
        scheduler_port=options.scheduler_port or None,
        interface=options.interface if spec is None else spec.interface,
        protocol=protocol if spec is None else spec.protocol,
        nthreads=options.threads_per_worker if spec is None else spec.threads,
        memory_limit=options.memory_limit if spec is None else spec.memory_limit,
        local_directory=options.local_directory if spec is None else spec.local_directory,
        dashboard=bool(options.dashboard_address),
        dashboard_address=options.dashboard_address or ":0",
        worker_class=worker_class(options),
        worker_options=workers,
        worker_name="spillway",
    )


#: seconds rank 0 waits for every worker rank to join
WORKERS_TIMEOUT_S = 300


def _node_devices(inventory) -> list[int | str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [int(d) if d.strip().isdigit() else d.strip() for d in visible.split(",") if d.strip()]
    return [gpu.index for gpu in inventory.gpus]


class MPIRank:
    """Backend of ``spillway mpi``: this rank's part of a cluster of MPI ranks (dask-mpi's
    ``execute``). Rank 0 runs the scheduler and, in a thread, ``work(session)`` on the
    cluster once its ``n_workers`` workers joined; a worker rank runs the worker of its
    ``specs`` (its node's, resolved there; none for CPU workers) until rank 0 closes the
    cluster. :meth:`start` returns ``work``'s result on rank 0, None on the others."""

    def __init__(self, work: Callable[[Any], dict], *, comm, n_workers: int):
        self.work, self.comm, self.n_workers = work, comm, n_workers

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]) -> dict | None:
        from dask_mpi import execute

        rank, n_workers = self.comm.Get_rank(), self.n_workers
        spec = one_for_all(specs) if specs else None
        kwargs = execute_kwargs(options, n_workers=n_workers, spec=spec)
        if kwargs["protocol"] == "ucx":
            quiet_ucx()
        if rank == SCHEDULER_RANK and kwargs["protocol"] == "ucx":
            # the scheduler and the client read these as dask config, like the batch script's exports
            os.environ.update(commands.ucx_environment(options))
            dask.config.refresh()

        result: dict = {}

        def client():
            import dask.config
            from distributed import Client

            from spillway.launch import open_cluster

            address = dask.config.get("scheduler-address")
            try:
                with Client(address, timeout="60s") as c:
                    c.wait_for_workers(n_workers, timeout=WORKERS_TIMEOUT_S)
                with open_cluster(options.replace(scheduler_address=address)) as session:
                    result["report"] = self.work(session)
            except BaseException as e:  # reported on rank 0 after the cluster is closed
                result["error"] = e

        # a worker rank's nanny hands the config of the moment it is built to its worker
        with dask.config.set(worker_config(options, tiered_store=spec is not None and spec.tiered, gpu=not options.cpu)):
            execute(client, comm=self.comm, **kwargs)
        if rank != SCHEDULER_RANK:
            return None
        if "error" in result:
            raise result["error"]
        return result["report"]


def run(options: Options, work: Callable[[Any], dict], *, comm=None) -> dict | None:
    """Start the cluster on the MPI ranks and, on rank 0, return ``work(session)`` (the
    open cluster session); the worker ranks return None once rank 0 closes the cluster."""
    refuse_options(options, starter="spillway mpi", where="under MPI",
                   gpus_from="each rank takes one GPU by its place on the node",
                   no_tls="dask-mpi starts its scheduler without TLS; use spillway slurm or up")
    try:
        import dask_mpi  # noqa: F401 (the rank's backend runs it)
        from mpi4py import MPI
    except ImportError as e:
        raise OptionsError(f"mpi: {e.name} is not installed; install spillway[mpi]") from None

    comm = comm or MPI.COMM_WORLD
    rank, n_workers = comm.Get_rank(), check_world(comm.Get_size())
    protocol = commands.protocol(options, gpu=not options.cpu, n_workers=n_workers)
    node_ranks = comm.Split_type(MPI.COMM_TYPE_SHARED).allgather(rank)

    # the cluster's plan as known before a rank knows its node; a GPU worker rank plans its node
    launch = LaunchPlan(kind="cpu" if options.cpu else "gpu", n_workers=n_workers, protocol=protocol)
    specs: tuple[WorkerSpec, ...] = ()
    if rank != SCHEDULER_RANK and not options.cpu:
        from spillway.options.gpus import discover

        # the node's GPUs, seen before this rank is narrowed to its own
        inventory = discover()
        # one GPU per worker rank (workers-per-gpu ranks share one): CUDAWorker starts one
        # worker per visible GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device_for_rank(rank, node_ranks, _node_devices(inventory),
                                                                 options.workers_per_gpu))
        # the rank's share of its node's host and pinned memory, like a local cluster's worker
        workers = len([r for r in node_ranks if r != SCHEDULER_RANK])
        on_node = options.replace(protocol=protocol)
        launch = node_plan(on_node, inventory, HostProbe.here(), workers=workers)
        specs = worker_specs(on_node, launch)
    return MPIRank(work, comm=comm, n_workers=n_workers).start(options, launch, specs)
