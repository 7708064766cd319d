"""Local GPU cluster: dask-cuda's LocalCUDACluster, one worker per selected GPU."""

from __future__ import annotations

from ..options import Options
from .plan import LaunchPlan


def cluster_kwargs(options: Options, plan: LaunchPlan) -> dict:
    """LocalCUDACluster keywords for ``options``: a pure function, tested without a GPU."""
    uses_rmm = options.rmm_pool_size is not None or options.rmm_managed_memory or options.rmm_async
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
        dashboard_address=options.dashboard_address or None,
        security=options.security,
        rmm_pool_size=options.rmm_pool_size,
        rmm_maximum_pool_size=options.rmm_maximum_pool_size,
        rmm_managed_memory=options.rmm_managed_memory,
        rmm_async=options.rmm_async,
        rmm_release_threshold=options.rmm_release_threshold,
        rmm_log_directory=options.rmm_log_directory,
        rmm_track_allocations=options.rmm_track_allocations,
        # CuPy allocates through RMM so its chunks come from the worker's pool
        rmm_allocator_external_lib_list=["cupy"] if uses_rmm else None,
        silence_logs=False,
    )
    if plan.protocol == "ucx":
        # dask-cuda sets UCX_TLS for CUDA IPC over NVLink from this flag
        kwargs["enable_nvlink"] = options.nvlink
    if options.interface is not None:
        kwargs.pop("host")
    return kwargs


def start(options: Options, plan: LaunchPlan):
    import logging

    from dask_cuda import LocalCUDACluster

    kwargs = cluster_kwargs(options, plan)
    kwargs["silence_logs"] = logging.WARNING
    return LocalCUDACluster(**kwargs)
