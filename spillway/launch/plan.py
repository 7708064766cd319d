"""Decide what to start from the options and the GPU inventory: a pure function.

Kept apart from the launchers so every machine-dependent check (unknown device, more
workers than GPUs, UCXX missing) runs, and is tested, before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from spillway.options.errors import GpusBusy, OptionsError
from spillway.options.gpus import Inventory
from ..memory.growth import host_total
from spillway.options.settings import OPTIONS, Options
from .protocol import choose_protocol


@dataclass(frozen=True)
class LaunchPlan:
    #: "gpu", "cpu" or "attach"
    kind: str
    #: CUDA device identifiers (indices or UUIDs), one per worker, in worker order: a GPU
    #: appears once for each of its workers (``workers_per_gpu``)
    devices: tuple[int | str, ...] = ()
    n_workers: int = 0
    #: "ucx" or "tcp"
    protocol: str = "tcp"
    #: why the plan differs from what a user may expect (TCP instead of UCX, CPU instead of GPU)
    notes: tuple[str, ...] = ()
    #: bytes of memory of this host (GPU plans: what the workers' pinned memory is bounded by)
    host_memory: int = 0
    #: bytes of each worker's share of its GPU (the GPU's memory over its workers), in
    #: worker order (empty where not known): their sum is the GPUs' memory
    device_memory: tuple[int, ...] = ()
    #: worker processes on each GPU
    workers_per_gpu: int = 1

    @property
    def gpus(self) -> tuple[int | str, ...]:
        """The GPUs of the plan, each once, in worker order."""
        return tuple(dict.fromkeys(self.devices))

    @property
    def pinned_limit(self) -> int | None:
        """Pinned host bytes each worker of this host may hold (None: not bounded here)."""
        if not self.host_memory or not self.n_workers:
            return None
        return int(PINNED_HOST_FRACTION * self.host_memory) // self.n_workers


#: the share of the host's memory the workers of one host may pin between them. Pinned
#: (page-locked) memory cannot be swapped or reclaimed: on the 2 x H200 host (270 GB) two
#: workers pinning 80 GB each, beside their CUDA contexts, were killed by the kernel's
#: out-of-memory killer before they started, with nothing in the logs but a lost worker.
PINNED_HOST_FRACTION = 0.5


def ucxx_installed() -> bool:
    return importlib.util.find_spec("distributed_ucxx") is not None


def cuda_stack_installed() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("dask_cuda", "cupy"))


@dataclass(frozen=True)
class HostProbe:
    """What the plan reads of the machine it starts workers on, beside its GPUs (the
    :class:`~spillway.options.gpus.Inventory`): the libraries installed, its cores and its memory.
    :meth:`here` reads this machine's; tests describe others."""

    #: distributed-ucxx is installed
    have_ucxx: bool
    #: dask-cuda and CuPy are installed
    have_cuda_stack: bool
    #: the CPU cores (what CPU workers are counted from)
    cpu_count: int
    #: bytes of memory this host's workers may use (:func:`~..memory.growth.host_total`)
    host_memory: int
    #: uvloop is installed (``event-loop: uvloop``)
    have_uvloop: bool = False

    @classmethod
    def here(cls) -> HostProbe:
        """This machine's."""
        return cls(have_ucxx=ucxx_installed(), have_cuda_stack=cuda_stack_installed(),
                   cpu_count=os.cpu_count() or 1, host_memory=host_total(),
                   have_uvloop=importlib.util.find_spec("uvloop") is not None)


def plan(options: Options, inventory: Inventory, host: HostProbe, *, gpus_free: bool = True) -> LaunchPlan:
    """What to start on the machine of ``inventory`` and ``host`` (``HostProbe.here()``
    for this one). ``gpus_free=False`` plans on the GPUs' totals without refusing a GPU
    another process holds now: what a run's admission sizes against, so that a run that
    fits nowhere is told so even while a closing cluster still holds its pool."""
    if options.attach:
        return LaunchPlan(kind="attach")
    have_ucxx, have_cuda_stack = host.have_ucxx, host.have_cuda_stack
    notes = []
    if options.event_loop == "uvloop" and not host.have_uvloop:
        # else each worker process would fail at its start, after the scheduler's
        raise OptionsError("event-loop: uvloop requested but the uvloop package is not installed "
                           "(pip install uvloop, or event-loop auto)")

    if options.devices is not None:
        if not len(inventory):
            raise OptionsError(
                f"devices: {','.join(map(str, options.devices))} requested but no GPU is visible ({inventory.reason})"
            )
        for device in options.devices:
            if inventory.find(device) is None:
                known = ", ".join(str(g.index) for g in inventory.gpus)
                raise OptionsError(f"devices: GPU {device!r} does not exist (visible: {known})")

    use_gpu = not options.cpu and len(inventory) > 0 and have_cuda_stack
    if not options.cpu and len(inventory) > 0 and not have_cuda_stack:
        if options.devices is not None:
            raise OptionsError(
                "devices: GPUs requested but dask-cuda/CuPy are not installed; "
                "install spillway[cuda13] or spillway[cuda12]"
            )
        notes.append("GPUs found but dask-cuda/CuPy are not installed: running on CPU workers")
    elif not options.cpu and not len(inventory):
        notes.append(f"no GPU found ({inventory.reason}): running on CPU workers")

    if not use_gpu:
        unused = gpu_options_set(options)
        if unused:
            them = "it" if len(unused) == 1 else "them"
            notes.append(f"{', '.join(unused)}: only GPU workers use {them}; these are CPU workers, which leave "
                         f"{them} aside")
        cores = host.cpu_count
        n = options.n_workers or max(1, min(4, cores // options.threads_per_worker))
        protocol, _ = choose_protocol(options.protocol, gpu=False, n_workers=n, have_ucxx=have_ucxx)
        return LaunchPlan(kind="cpu", n_workers=n, protocol=_over_tls(options, protocol, notes), notes=tuple(notes))

    if options.devices is None:
        devices = tuple(g.index for g in inventory.gpus)
    else:
        devices = tuple(inventory.find(d).index for d in options.devices)
    per_gpu = options.workers_per_gpu
    n = options.n_workers if options.n_workers is not None else len(devices) * per_gpu
    if n > len(devices) * per_gpu:
        raise OptionsError(
            f"n-workers: {n} workers need {-(-n // per_gpu)} GPUs but only {len(devices)} are selected "
            f"({per_gpu} worker(s) per GPU; raise workers-per-gpu to place more on each)"
        )
    if n % per_gpu:
        raise OptionsError(f"n-workers: {n} is not a multiple of workers-per-gpu {per_gpu} "
                           "(every GPU gets the same number of workers)")
    # each GPU once per worker of it, its workers next to each other
    devices = tuple(d for d in devices[:n // per_gpu] for _ in range(per_gpu))
    host_memory = host.host_memory
    _check_pinned(options, n, host_memory)
    protocol, note = choose_protocol(options.protocol, gpu=True, n_workers=n, have_ucxx=have_ucxx)
    if options.rmm_async and protocol == "ucx" and options.nvlink and n > 1:
        raise OptionsError(ASYNC_OVER_NVLINK.format(n=n))
    if gpus_free:
        _check_gpus_free(options, inventory, devices, per_gpu)

    if note and per_gpu > 1:
        note = SHARED_GPU_TCP_NOTE.format(per_gpu=per_gpu)
    if note:
        notes.append(note)
    protocol = _over_tls(options, protocol, notes)
    return LaunchPlan(kind="gpu", devices=devices, n_workers=n, protocol=protocol, notes=tuple(notes),
                      host_memory=host_memory, workers_per_gpu=per_gpu,
                      device_memory=tuple(inventory.find(d).memory_total // per_gpu for d in devices))


def _over_tls(options: Options, protocol: str, notes: list[str]) -> str:
    """``tls`` wherever the cluster has TLS (its files, or ``security: true``): distributed's
    comms then refuse a peer without the cluster's certificate. UCX carries no TLS, so a
    cluster that asks for both talks TLS over TCP (chunks staged through host memory) and
    says so; without security a UCX cluster's comms, like TCP's, take any local process."""
    if not (options.tls_ca_file or options.security):
        return protocol
    if protocol == "ucx":
        notes.append(TLS_NOT_UCX_NOTE)
    return "tls"


#: UCX 1.21 maps no async pool's memory through CUDA IPC without fabric handles (which an
#: NVLink host without IMEX does not have) and stages every chunk of it through the host
#: over the workers' TCP: on two H200s (2026-11-28) an 800 MB chunk took 4.4-5.4 s and the
#: ten-run probe's first run 5.6-21.1 s, against 0.23-0.58 s with the pool
ASYNC_OVER_NVLINK = ("rmm-async: the {n} GPU workers would move every chunk between GPUs through host memory "
                     "over TCP at about 0.2 GB/s (UCX maps no async pool's memory over NVLink); leave "
                     "rmm-async off for the pool (rmm-pool-size auto), or run one worker")

TLS_NOT_UCX_NOTE = ("protocol: TLS over TCP rather than UCX, because the cluster requires TLS (security or "
                    "the TLS files) and UCX carries none: chunks between GPU workers are staged through host "
                    "memory, without NVLink or the data plane")

#: why the workers of one GPU talk TCP
SHARED_GPU_TCP_NOTE = ("protocol: TCP between the {per_gpu} workers of each GPU because distributed-ucxx is not "
                       "installed: every chunk they exchange goes device -> host -> TCP -> host -> device "
                       "(install spillway[cuda13] for CUDA IPC within the GPU)")


def gpu_options_set(options: Options) -> list[str]:
    """``key=value`` of each option only GPU workers use that was set somewhere (not left
    at its default): what CPU workers would otherwise leave aside without a word."""
    from spillway.options.sizes import format_bytes

    def shown(value):
        large = isinstance(value, int) and not isinstance(value, bool) and value >= 2**20
        return format_bytes(value) if large else value

    return [f"{o.key}={shown(o.as_config(getattr(options, o.name)))}" for o in OPTIONS
            if o.gpu and options.sources.get(o.name, "default") != "default"]


def uses_tiered_store(options: Options) -> bool:
    # with managed memory the driver migrates pages itself: there is no device tier to manage
    return options.memory_store == "tiered" and not options.rmm_managed_memory


#: device memory a worker's CUDA context and libraries take beside its RMM pool
CONTEXT_BYTES = 2**30


def _check_gpus_free(options: Options, inventory: Inventory, devices: tuple[int, ...], per_gpu: int) -> None:
    """Refuse a GPU whose free memory cannot hold its workers' RMM pools: another process
    holding it (a cluster still closing, someone else's job) made the pool fail inside the
    worker, which the cluster reported as a worker that did not start within 120 s."""
    pool = options.pool_size
    if pool is None or options.rmm_managed_memory:
        return
    for index in sorted(set(devices)):
        gpu = inventory.find(index)
        need = (int(pool * gpu.memory_total) if isinstance(pool, float) else int(pool) * per_gpu) + CONTEXT_BYTES * per_gpu
        if need > gpu.memory_free:
            held = gpu.memory_total - gpu.memory_free
            raise GpusBusy(
                f"GPU {gpu.index}: {gigabytes(gpu.memory_free)} free of {gigabytes(gpu.memory_total)} ({gigabytes(held)} held by other "
                f"processes), under the {gigabytes(need)} its {per_gpu} worker(s) need (rmm-pool-size {options.rmm_pool_size!r} "
                f"and {gigabytes(CONTEXT_BYTES)} each for CUDA); free the GPU, pick others with devices, or lower rmm-pool-size")


def _check_pinned(options: Options, n_workers: int, host_memory: int) -> None:
    """The pinned pools of all the workers of this host fit in its share of host memory
    (``auto`` is sized within it)."""
    if not uses_tiered_store(options) or options.pinned_pool_size in (0, "auto"):
        return
    total = int(options.pinned_pool_size) * n_workers
    limit = int(PINNED_HOST_FRACTION * host_memory)
    if total > limit:
        raise OptionsError(
            f"pinned-pool-size: {gigabytes(options.pinned_pool_size)} per worker x {n_workers} workers = "
            f"{gigabytes(total)} of pinned host memory, over the {gigabytes(limit)} limit "
            f"({PINNED_HOST_FRACTION:.0%} of this host's {gigabytes(host_memory)}); pinned memory cannot be "
            f"swapped, and workers past it are killed by the out-of-memory killer"
        )


def gigabytes(n) -> str:
    return f"{int(n) / 1e9:.1f} GB"
