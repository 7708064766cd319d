"""Pure decisions of an MPI launch: the GPU of each worker rank and the worker keywords."""

from __future__ import annotations

from collections.abc import Sequence

from spillway.options.errors import OptionsError
from spillway.launch import (TIERED_WORKER, WorkerSpec, dask_cuda_kwargs, off_node_spec, store_data, uses_tiered_store)
from spillway.options.settings import Options

from .. import commands

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
