"""Local GPU cluster: dask-cuda's LocalCUDACluster, one worker per selected GPU."""

from __future__ import annotations

from ..options import Options
from .http_server import cluster_class, dashboard_kwargs
from .plan import LaunchPlan, uses_tiered_store
from .worker_config import worker_config
from .worker_store import store_spec


def cluster_kwargs(options: Options, plan: LaunchPlan) -> dict:
    """LocalCUDACluster keywords for ``options``: a pure function, tested without a GPU."""
    kwargs = dict(
        CUDA_VISIBLE_DEVICES=list(plan.devices),
        n_workers=plan.n_workers,
        threads_per_worker=options.threads_per_worker,
        memory_limit=options.memory_limit,
        device_memory_limit=options.device_memory_limit,
        local_directory=options.local_directory,
        protocol=plan.protocol,
        interface=options.interface,
        host=options.host,
        scheduler_port=options.scheduler_port,
        **dashboard_kwargs(options),
        security=options.security,
        silence_logs=False,
        **rmm_kwargs(options),
    )
    if plan.protocol == "ucx":
        # dask-cuda sets UCX_TLS for CUDA IPC over NVLink from this flag
        kwargs["enable_nvlink"] = options.nvlink
    if options.interface is not None:
        kwargs.pop("host")
    if uses_tiered_store(options):
        kwargs["data"] = store_spec(options, plan, host_limit(options, plan))
    return kwargs


def rmm_kwargs(options: Options) -> dict:
    """dask-cuda's RMM keywords (LocalCUDACluster, CUDAWorker) for ``options``."""
    return dict(
        rmm_pool_size=options.pool_size,
        rmm_maximum_pool_size=options.rmm_maximum_pool_size,
        rmm_managed_memory=options.rmm_managed_memory,
        rmm_async=options.rmm_async,
        rmm_release_threshold=options.rmm_release_threshold,
        rmm_log_directory=options.rmm_log_directory,
        rmm_track_allocations=options.rmm_track_allocations,
        # CuPy allocates through RMM so its chunks come from the worker's pool
        rmm_allocator_external_lib_list=["cupy"] if options.uses_rmm else None,
    )


#: host memory a GPU worker process needs beside its spilled chunks: its CUDA context,
#: Python and the libraries, the host side of its tasks
PROCESS_BYTES = 2 * 2**30


def host_limit(options: Options, plan: LaunchPlan) -> int | None:
    """Host bytes per worker for spilled chunks (None: no limit): distributed's reading of
    ``memory_limit``, less the worker process's own needs and its share of the memory the
    machine keeps free. With ``auto`` the limit is the whole machine shared out, and a
    host tier that size let a worker reach 101 of the H100 host's 126 GiB and be killed
    by the kernel; the store also goes to disk early when the machine runs low
    (:class:`~spillway.service.memory.store.TieredStore`'s ``host_available``)."""
    import logging

    from distributed.worker_memory import parse_memory_limit

    from ..memory.growth import headroom_for, host_total

    limit = parse_memory_limit(options.memory_limit or None, 1, total_cores=plan.n_workers,
                               logger=logging.getLogger("spillway"))
    if not limit:
        return limit
    reserve = headroom_for(host_total()) // max(1, plan.n_workers) + PROCESS_BYTES
    return max(limit - reserve, limit // 2)


def start(options: Options, plan: LaunchPlan):
    import logging

    import dask.config
    from dask_cuda import LocalCUDACluster

    kwargs = cluster_kwargs(options, plan)
    kwargs["silence_logs"] = logging.WARNING
    with dask.config.set(worker_config(options, tiered_store=uses_tiered_store(options))):
        return cluster_class(LocalCUDACluster, kwargs)(**kwargs)
