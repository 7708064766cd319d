"""What one GPU worker is started with, resolved once: :class:`WorkerSpec`.

:func:`worker_specs` turns the options, the launch plan and the facts of the host into one
frozen spec per worker; every launcher renders those specs (:mod:`.render`) instead of
reading the options itself, so a setting is interpreted here and nowhere else: the device
and host memory limits become bytes (None is "no limit", whatever the option said),
``pinned-pool-size: auto`` becomes the arena's bytes, ``rmm-pool-size: auto`` the pool the
allocator takes.

A spec built away from the workers' node (a batch script rendered on the submit host, the
keywords of an MPI launch before a rank knows its node) cannot know the node's GPUs or
memory: there the limits stay fractions of the worker's GPU and of the host's memory, for
dask-cuda to take on the node, and the tiered store's host tier and arena are unknown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from spillway.options.errors import OptionsError
from spillway.options.settings import Options, RmmAndTls
from .plan import LaunchPlan, gigabytes, uses_tiered_store

#: the device limit of ``device-memory-limit: default``, as a fraction of the GPU
#: (dask-cuda's "default")
DEFAULT_DEVICE_FRACTION = 0.8
#: host memory a GPU worker process needs beside its spilled chunks: its CUDA context,
#: Python and the libraries, the host side of its tasks
PROCESS_BYTES = 2 * 2**30


@dataclass(frozen=True)
class HostFacts:
    """What the specs need to know of the host their workers run on, beyond the plan;
    None where they are built away from it."""

    #: bytes the host's processes may use, all of them together: distributed's reading
    #: (machine, cgroup, rlimit), what ``memory-limit`` shares out and bounds (each
    #: worker's own limit is :attr:`WorkerSpec.memory_limit`)
    host_memory_limit: int | None = None
    #: the host's memory (machine or cgroup), which the host tiers leave a headroom of
    host_total: int | None = None

    @classmethod
    def here(cls) -> HostFacts:
        """This machine's."""
        from ..memory.growth import host_total

        return cls(host_memory_limit=distributed_memory_limit(), host_total=host_total())


def distributed_memory_limit() -> int:
    """distributed's reading of this host's memory limit (``distributed.system.memory_limit``:
    the machine, its cgroup's limits, ``RLIMIT_RSS``), the one its workers' ``memory_limit``
    is shared out of, read without importing the distributed package: that import (0.9-1.0
    s on the GPU hosts) was most of a run refused before start, which needs only this
    number (:func:`~..upstream.system_memory_limit`)."""
    from .. import upstream

    return upstream.system_memory_limit()


@dataclass(frozen=True)
class WorkerSpec(RmmAndTls):
    """One GPU worker, every setting resolved. Adding a setting here means adding it to
    each renderer in :mod:`.render` (tests/launch/test_worker_spec.py fails until then)."""

    #: the worker's CUDA device (index or UUID); None: the device(s) the process is given
    device: int | str | None
    #: worker processes on the worker's GPU, this one included; the relative settings
    #: below (limits, pool) are already this worker's share of the GPU
    workers_per_gpu: int
    #: "ucx" or "tcp"
    protocol: str
    #: CUDA IPC over NVLink between the workers (used over UCX only)
    nvlink: bool
    threads: int
    #: bytes of the GPU the store (or dask-cuda's) keeps before spilling to host; None: no
    #: limit; a fraction of the GPU only where built away from the node
    device_memory_limit: int | float | None
    #: distributed's memory limit of the worker process: bytes; None: no limit; a fraction
    #: of the host only where built away from the node
    memory_limit: int | float | None
    #: "tiered" (spillway's store) or "dask-cuda" (dask-cuda's); managed memory has no
    #: device tier to manage, so it always gets dask-cuda's
    memory_store: str
    #: bytes of the tiered store's host tier; None: no limit (or not known off the node)
    host_limit: int | None
    #: bytes of the pinned arena the tiered store grows; None where built off the node
    pinned_arena: int | None
    #: pinned host bytes the worker may hold in all; None: not bounded here
    pinned_limit: int | None
    #: RMM: the pool (``Options.pool_size``: bytes or a fraction of the GPU, the worker's
    #: share of it; None: no pool), its maximum, ...
    pool_size: int | float | None
    rmm_maximum_pool_size: int | float | None
    rmm_managed_memory: bool
    rmm_async: bool
    rmm_release_threshold: int | float | None
    rmm_log_directory: str | None
    rmm_track_allocations: bool
    local_directory: str | None
    interface: str | None
    tls_ca_file: str | None
    tls_cert: str | None
    tls_key: str | None

    @property
    def tiered(self) -> bool:
        return self.memory_store == "tiered"


def worker_specs(options: Options, plan: LaunchPlan, facts: HostFacts | None = None) -> tuple[WorkerSpec, ...]:
    """The spec of each GPU worker of ``plan`` (one host's workers), in worker order; one
    spec with no device where the plan names none (a node away from here). ``facts``:
    this machine's when not given."""
    facts = HostFacts.here() if facts is None else facts
    if plan.devices:
        gpus = zip(plan.devices, plan.device_memory or (None,) * len(plan.devices), strict=True)
    else:
        gpus = [(None, None)]
    return tuple(_spec(options, plan, facts, device, memory) for device, memory in gpus)


def _spec(options: Options, plan: LaunchPlan, facts: HostFacts, device, device_memory: int | None) -> WorkerSpec:
    memory_limit = distributed_limit(options.memory_limit, facts.host_memory_limit, plan.n_workers)
    tiered = uses_tiered_store(options)
    # the store's host tier and arena follow from the host's memory, unknown off the node
    known = facts.host_memory_limit is not None
    host = host_limit(memory_limit, facts, plan.n_workers) if known else None
    arena = pinned_arena(options.pinned_pool_size, plan.pinned_limit, host) if known else None
    if tiered:
        check_pinned_fits(options.pinned_pool_size, memory_limit)
    per_gpu = plan.workers_per_gpu
    device_memory_limit = device_limit(options.device_memory_limit, device_memory)
    if device_memory is None:  # a fraction of the whole GPU: this worker's part of it
        device_memory_limit = gpu_share(device_memory_limit, per_gpu)
    return WorkerSpec(
        device=device,
        workers_per_gpu=per_gpu,
        protocol=plan.protocol,
        nvlink=options.nvlink,
        threads=options.threads_per_worker,
        device_memory_limit=device_memory_limit,
        memory_limit=memory_limit,
        memory_store="tiered" if tiered else "dask-cuda",
        host_limit=host,
        pinned_arena=arena if tiered else 0,
        pinned_limit=plan.pinned_limit,
        pool_size=gpu_share(options.pool_size, per_gpu),
        rmm_maximum_pool_size=gpu_share(options.maximum_pool_size, per_gpu),
        rmm_managed_memory=options.rmm_managed_memory,
        rmm_async=options.rmm_async,
        rmm_release_threshold=gpu_share(options.rmm_release_threshold, per_gpu),
        rmm_log_directory=options.rmm_log_directory,
        rmm_track_allocations=options.rmm_track_allocations,
        local_directory=options.local_directory,
        interface=options.interface,
        tls_ca_file=options.tls_ca_file,
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
    )


def gpu_share(value: int | float | None, workers_per_gpu: int) -> int | float | None:
    """A worker's part of a setting of its GPU: a fraction of the GPU (how dask-cuda reads
    a float) is shared by the GPU's ``workers_per_gpu`` workers; bytes are already one
    worker's, as every size option is."""
    if isinstance(value, float):
        return value / workers_per_gpu
    return value


def device_limit(value: int | float | str, device_memory: int | None) -> int | float | None:
    """``device-memory-limit`` in bytes of a GPU (or a worker's share of one) of
    ``device_memory`` bytes, as dask-cuda reads it: ``default`` is 80% of the GPU, ``auto`` all of it, a float a fraction of it,
    0 none (None). With ``device_memory`` unknown (None) a relative limit stays a fraction."""
    fraction = {"default": DEFAULT_DEVICE_FRACTION, "auto": 1.0}.get(value, value)
    if not fraction:
        return None
    if isinstance(fraction, float):
        return fraction if device_memory is None else int(device_memory * fraction)
    return int(fraction)


def distributed_limit(value: int | float | str, host_memory_limit: int | None, n_workers: int) -> int | float | None:
    """``memory-limit`` of each of ``n_workers`` worker processes of a host whose processes
    may use ``host_memory_limit`` bytes, as distributed reads it for them: ``auto`` is an equal
    share, a float that fraction of the host, 0 none (None); bytes stay as given
    (distributed bounds them by the host's and says so). With ``host_memory_limit`` unknown
    (None) a relative limit stays a fraction of the host."""
    fraction = 1 / max(1, n_workers) if value == "auto" else value
    if not fraction:
        return None
    if isinstance(fraction, float):
        return fraction if host_memory_limit is None else int(host_memory_limit * fraction)
    return int(fraction)


def host_limit(memory_limit: int | None, facts: HostFacts, n_workers: int) -> int | None:
    """Host bytes per worker for spilled chunks (None: no limit): the worker's memory
    limit (at most the host's), less the worker process's own needs and its share of the
    memory the machine keeps free. With ``auto`` the limit is the whole machine shared out,
    and a host tier that size let a worker reach 101 of the H100 host's 126 GiB and be
    killed by the kernel; the store also goes to disk early when the machine runs low
    (:class:`~spillway.memory.store.TieredStore`'s ``host_available``)."""
    from ..memory.growth import headroom_for

    if not memory_limit:
        return None
    limit = min(int(memory_limit), facts.host_memory_limit)
    reserve = headroom_for(facts.host_total) // max(1, n_workers) + PROCESS_BYTES
    return max(limit - reserve, limit // 2)


def pinned_arena(value: int | str, pinned_limit: int | None, host: int | None) -> int:
    """The pinned arena each worker grows: ``auto`` is the worker's share of the pinned
    bound (:attr:`LaunchPlan.pinned_limit`), at most its host tier (``host``): pinning more
    than the host tier holds would never be used."""
    if value != "auto":
        return int(value)
    bounds = [int(b) for b in (pinned_limit, host) if b]
    return min(bounds) if bounds else 0


def check_pinned_fits(pinned_pool_size: int | str, memory_limit: int | float | None) -> None:
    """Refuse an explicit pinned pool that leaves the worker process less than
    :data:`PROCESS_BYTES` under its memory limit: the pool's pages are the process's, so
    the worker would sit over its limit with nothing of the store's to write to disk (B3
    with 20 GB pinned under a 20 GB limit paused its worker for good on the H100 host)."""
    if pinned_pool_size == "auto" or not pinned_pool_size or not isinstance(memory_limit, int) or not memory_limit:
        return
    room = memory_limit - PROCESS_BYTES
    if int(pinned_pool_size) > room:
        raise OptionsError(
            f"pinned-pool-size: {gigabytes(int(pinned_pool_size))} per worker is over its memory-limit of "
            f"{gigabytes(memory_limit)} less {gigabytes(PROCESS_BYTES)} for the worker process itself; the pool counts "
            f"toward the limit: use a pinned-pool-size of at most {gigabytes(max(0, room))} or a larger memory-limit")


def off_node_spec(options: Options, *, protocol: str, workers: int) -> WorkerSpec:
    """The spec of the GPU workers of a node, ``workers`` of them (``workers-per-gpu`` on
    each of its GPUs), as far as it is known
    away from the node (its GPUs and memory unknown): a batch script's on the submit
    host, an MPI rank's before it knows its node."""
    node = LaunchPlan(kind="gpu", n_workers=workers, protocol=protocol, workers_per_gpu=options.workers_per_gpu)
    return one_for_all(worker_specs(options, node, HostFacts()))


def one_for_all(specs: tuple[WorkerSpec, ...]) -> WorkerSpec:
    """The spec a launcher that starts all of a host's workers from one set of keywords
    (LocalCUDACluster, dask-cuda's CUDAWorker) passes: the workers' specs differ only in
    their device and, on a host of GPUs of different sizes, in a relative device limit,
    of which the smallest is taken so that it fits every worker's GPU."""
    first = dataclasses.replace(specs[0], device=None)
    limits = [s.device_memory_limit for s in specs]
    if all(isinstance(v, int) for v in limits):
        first = dataclasses.replace(first, device_memory_limit=min(limits))
    for spec in specs[1:]:
        if dataclasses.replace(spec, device=None, device_memory_limit=first.device_memory_limit) != first:
            raise OptionsError(f"devices: workers {specs[0].device} and {spec.device} cannot share one set of "
                               "worker settings")
    return first
