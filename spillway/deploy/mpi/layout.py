"""Pure decisions of an MPI launch: the GPU of each worker rank and the worker keywords."""

from __future__ import annotations

from collections.abc import Sequence

from spillway.service.errors import OptionsError
from spillway.service.launch.local_gpu import rmm_kwargs
from spillway.service.launch.plan import uses_tiered_store
from spillway.service.options import Options

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


def device_for_rank(rank: int, node_ranks: Sequence[int], devices: Sequence[int | str]) -> int | str:
    """The GPU of worker ``rank``: its place among the worker ranks of its node picks one
    of the node's ``devices``, so ranks on a node never share a GPU."""
    workers = sorted(r for r in node_ranks if r != SCHEDULER_RANK)
    place = workers.index(rank)
    if place >= len(devices):
        raise OptionsError(
            f"mpi: rank {rank} is worker {place + 1} on its node but the node has {len(devices)} GPU(s); "
            "start one rank per GPU (plus one for the scheduler on the first node)"
        )
    return devices[place]


#: dask-cuda's CUDAWorker given spillway's tiered store (``data`` among its keywords)
TIERED_WORKER = "spillway.service.launch.gpu_worker.TieredCUDAWorker"


def worker_class(options: Options) -> str:
    if options.cpu:
        return "distributed.Nanny"
    return TIERED_WORKER if uses_tiered_store(options) else "dask_cuda.CUDAWorker"


def worker_options(options: Options, *, protocol: str) -> dict:
    """Keywords of each rank's worker beyond those dask-mpi passes itself (interface,
    protocol, threads, host memory limit, local directory, name). The tiered store's
    ``data`` depends on the rank's node and is added on the rank (:mod:`.launch`)."""
    if options.cpu:
        return {}
    out = dict(device_memory_limit=options.device_memory_limit, **rmm_kwargs(options))
    if protocol == "ucx":
        out["enable_nvlink"] = options.nvlink
    return out


def execute_kwargs(options: Options, *, n_workers: int) -> dict:
    """Keywords of ``dask_mpi.execute`` for ``options`` (the client function aside)."""
    protocol = commands.protocol(options, gpu=not options.cpu, n_workers=n_workers)
    return dict(
        client_rank=SCHEDULER_RANK,
        scheduler_rank=SCHEDULER_RANK,
        exclusive_workers=True,
        scheduler_port=options.scheduler_port or None,
        interface=options.interface,
        protocol=protocol,
        nthreads=options.threads_per_worker,
        memory_limit=options.memory_limit,
        local_directory=options.local_directory,
        dashboard=bool(options.dashboard_address),
        dashboard_address=options.dashboard_address or ":0",
        worker_class=worker_class(options),
        worker_options=worker_options(options, protocol=protocol),
        worker_name="spillway",
    )
