"""A :class:`~.spec.WorkerSpec` in the forms its launchers take: dask-cuda's keywords
(LocalCUDACluster, CUDAWorker for ``spillway worker`` and MPI ranks), ``dask cuda worker``
flags, and the tiered store's ``data=``. Each renders every field of the spec (or says
here why a field is not its own); none interprets an option."""

from __future__ import annotations

from .spec import WorkerSpec
from .worker_store import build_store


def dask_cuda_kwargs(spec: WorkerSpec) -> dict:
    """The worker keywords LocalCUDACluster and CUDAWorker share, ``data`` aside (with the
    tiered store each caller adds :func:`store_data`, which only a spec resolved on the
    workers' node has). Threads, the interface and TLS are the caller's: LocalCUDACluster
    and CUDAWorker name the threads differently, LocalCUDACluster takes the interface and
    TLS for its scheduler as well, and dask-mpi passes the interface itself."""
    kwargs = dict(
        device_memory_limit=spec.device_memory_limit,
        memory_limit=spec.memory_limit,
        local_directory=spec.local_directory,
        protocol=spec.protocol,
        rmm_pool_size=spec.pool_size,
        rmm_maximum_pool_size=spec.rmm_maximum_pool_size,
        rmm_managed_memory=spec.rmm_managed_memory,
        rmm_async=spec.rmm_async,
        rmm_release_threshold=spec.rmm_release_threshold,
        rmm_log_directory=spec.rmm_log_directory,
        rmm_track_allocations=spec.rmm_track_allocations,
        # CuPy allocates through RMM so its chunks come from the worker's pool
        rmm_allocator_external_lib_list=["cupy"] if spec.uses_rmm else None,
    )
    if spec.protocol == "ucx":
        # dask-cuda sets UCX_TLS for CUDA IPC over NVLink from this flag
        kwargs["enable_nvlink"] = spec.nvlink
    return kwargs


def cuda_worker_kwargs(spec: WorkerSpec) -> dict:
    """spillway's ``TieredCUDAWorker`` keywords (dask-cuda's ``CUDAWorker``'s, the
    workers of each GPU and the tiered store's ``data``), the scheduler aside."""
    kwargs = dict(nthreads=spec.threads, interface=spec.interface, security=spec.dask_security,
                  workers_per_gpu=spec.workers_per_gpu, **dask_cuda_kwargs(spec))
    if spec.tiered:
        kwargs["data"] = store_data(spec)
    return kwargs


def store_data(spec: WorkerSpec) -> tuple:
    """``(build_store, kwargs)``: distributed's ``data=`` for a worker of ``spec``."""
    if spec.pinned_arena is None or not isinstance(spec.device_memory_limit, (int, type(None))):
        raise ValueError("the tiered store is built from a spec resolved on the workers' node")
    return (build_store, {
        "protocol": spec.protocol,
        "device_memory_limit": spec.device_memory_limit,
        "host_limit": spec.host_limit,
        "pinned_pool_size": spec.pinned_arena,
        "pinned_limit": spec.pinned_limit,
        "memory_limit": spec.memory_limit,
    })


def flag_value(value) -> str:
    # ints are bytes, floats fractions; dask and dask-cuda read both from strings
    return repr(value) if isinstance(value, float) else str(value)


def dask_cuda_worker_flags(spec: WorkerSpec) -> list[str]:
    """Flags of ``dask cuda worker`` for ``spec`` with dask-cuda's store (the command has
    no flag for another); no limit is 0, as dask-cuda reads it."""
    if spec.tiered:
        raise ValueError("dask cuda worker cannot be given spillway's tiered store; run spillway worker")
    if spec.workers_per_gpu != 1:
        raise ValueError(f"dask cuda worker starts one worker per GPU, not {spec.workers_per_gpu}; "
                         "run spillway worker")
    args = ["--protocol", spec.protocol, "--nthreads", str(spec.threads),
            "--memory-limit", flag_value(spec.memory_limit or 0),
            "--device-memory-limit", flag_value(spec.device_memory_limit or 0)]
    if spec.interface:
        args += ["--interface", spec.interface]
    for flag, value in (("--rmm-pool-size", spec.pool_size),
                        ("--rmm-maximum-pool-size", spec.rmm_maximum_pool_size),
                        ("--rmm-release-threshold", spec.rmm_release_threshold),
                        ("--rmm-log-directory", spec.rmm_log_directory),
                        ("--local-directory", spec.local_directory)):
        if value is not None:
            args += [flag, flag_value(value)]
    for flag, on in (("--rmm-managed-memory", spec.rmm_managed_memory),
                     ("--rmm-async", spec.rmm_async),
                     ("--rmm-track-allocations", spec.rmm_track_allocations)):
        if on:
            args.append(flag)
    if spec.uses_rmm:
        # CuPy allocates through RMM so its chunks come from the worker's pool
        args += ["--set-rmm-allocator-for-libs", "cupy"]
    if spec.protocol == "ucx":
        # dask-cuda sets UCX_TLS for CUDA IPC over NVLink from this flag
        args.append("--enable-nvlink" if spec.nvlink else "--disable-nvlink")
    return args + tls_flags(spec.tls_ca_file, spec.tls_cert, spec.tls_key)


def tls_flags(ca_file: str | None, cert: str | None, key: str | None) -> list[str]:
    """The TLS flags every dask command takes alike (none without a CA file)."""
    if not ca_file:
        return []
    return ["--tls-ca-file", ca_file, "--tls-cert", cert, "--tls-key", key]
