"""The GPU workers of one node of a cluster spillway did not start locally: ``spillway
worker`` in a batch job, and each MPI worker rank.

dask-cuda's ``CUDAWorker`` (what ``dask cuda worker`` runs) starts one nanny per visible
GPU with its RMM pool, CPU affinity, UCX settings and ``CUDA_VISIBLE_DEVICES``, but picks
the workers' ``data`` itself (its own device/host store) and has no keyword or flag for
another. :class:`TieredCUDAWorker` is that worker with one change: before its nannies
start, each one's worker keywords get spillway's tiered store (:func:`use_store`), the
same ``(build_store, kwargs)`` the local GPU cluster passes. distributed's ``--preload``
is no way in: preloads start after the worker is built and listening, and the worker's
state keeps the store it was built with.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterable

from ..options import Options
from .plan import LaunchPlan, plan, uses_tiered_store

logger = logging.getLogger("spillway")

#: seconds a worker waits for a lost scheduler before it exits, so a worker whose
#: scheduler died does not hold its node until the wall time
DEATH_TIMEOUT_S = 60


def visible_gpus() -> int | None:
    """How many GPUs this process may use (``CUDA_VISIBLE_DEVICES``, as Slurm sets it for
    the task); None where it is unset (all of them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip()])


def node_plan(options: Options, inventory=None, *, workers: int | None = None, **plan_kwargs) -> LaunchPlan:
    """The plan of this node's ``workers`` GPU workers (default: one per GPU), with the
    node's pinned-memory bound shared among them. The scheduler and the job's total
    worker count belong to the job, not to the node, so they are left out here."""
    from ..errors import OptionsError
    from ..gpus import discover

    inventory = discover() if inventory is None else inventory
    if options.cpu or not len(inventory):
        why = "cpu is true" if options.cpu else f"no GPU found ({inventory.reason})"
        raise OptionsError(f"worker: {why}; spillway worker starts GPU workers, run CPU workers with `dask worker`")
    local = options.replace(scheduler_address=None, scheduler_file=None, n_workers=workers, devices=None)
    found = plan(local, inventory, **plan_kwargs)
    if found.kind != "gpu":
        raise OptionsError(f"worker: {'; '.join(found.notes)}")
    return found


def worker_kwargs(options: Options, node: LaunchPlan, *, death_timeout: float = DEATH_TIMEOUT_S) -> dict:
    """:class:`TieredCUDAWorker` keywords for this node: a pure function of the options
    and the node's plan (``data`` only with the tiered store)."""
    from .local_gpu import host_limit, rmm_kwargs
    from .worker_store import store_spec

    kwargs = dict(
        nthreads=options.threads_per_worker,
        memory_limit=options.memory_limit,
        device_memory_limit=options.device_memory_limit,
        local_directory=options.local_directory,
        interface=options.interface,
        security=options.security,
        protocol=node.protocol,
        death_timeout=death_timeout,
        **rmm_kwargs(options),
    )
    if options.scheduler_file:
        kwargs["scheduler_file"] = options.scheduler_file
    elif options.scheduler_address:
        kwargs["scheduler"] = options.scheduler_address
    if node.protocol == "ucx":
        # dask-cuda sets UCX_TLS for CUDA IPC over NVLink from this flag
        kwargs["enable_nvlink"] = options.nvlink
    if uses_tiered_store(options):
        kwargs["data"] = store_spec(options, node, host_limit(options, node))
    return kwargs


def node_store(options: Options, *, workers: int, inventory=None, **plan_kwargs) -> tuple:
    """The tiered store spec of one of this node's ``workers`` workers (an MPI rank's)."""
    from .local_gpu import host_limit
    from .worker_store import store_spec

    node = node_plan(options, inventory, workers=workers, **plan_kwargs)
    return store_spec(options, node, host_limit(options, node))


def use_store(nannies: Iterable, data) -> None:
    """Give the workers of ``nannies`` (not started yet) ``data`` instead of the store
    they were built with: a nanny passes its worker keywords to the worker process it
    starts."""
    for nanny in nannies:
        if not isinstance(getattr(nanny, "worker_kwargs", None), dict):
            raise RuntimeError(f"{type(nanny).__name__} keeps no worker keywords: this distributed "
                               "cannot be given spillway's tiered store; use memory-store dask-cuda")
        nanny.worker_kwargs["data"] = data


def _worker_class():
    from dask_cuda import CUDAWorker

    class TieredCUDAWorker(CUDAWorker):
        """dask-cuda's ``CUDAWorker`` whose workers are built with ``data``."""

        def __init__(self, *args, data=None, **kwargs):
            super().__init__(*args, **kwargs)
            if data is not None:
                use_store(self.nannies, data)

    TieredCUDAWorker.__module__, TieredCUDAWorker.__qualname__ = __name__, "TieredCUDAWorker"
    return TieredCUDAWorker


_classes: dict = {}


def __getattr__(name: str):
    # built on first use, so importing this module imports no GPU library (dask-mpi and
    # the CLI name the class by its import path)
    if name == "TieredCUDAWorker":
        if name not in _classes:
            _classes[name] = _worker_class()
        return _classes[name]
    raise AttributeError(name)


def run_node(options: Options, *, death_timeout: float = DEATH_TIMEOUT_S) -> None:
    """Start this node's workers and serve until they end (their lifetime, a lost
    scheduler) or SIGTERM/SIGINT, which closes them."""
    import dask.config

    from ..gpus import discover
    from .ucx_env import quiet_ucx
    from .worker_config import worker_config

    inventory = discover()
    node = node_plan(options, inventory, workers=visible_gpus())
    device_memory = max((g.memory_total for g in inventory.gpus), default=0)
    kwargs = worker_kwargs(options, node, death_timeout=death_timeout)
    if node.protocol == "ucx":
        quiet_ucx()
    worker_class = __getattr__("TieredCUDAWorker")

    async def serve():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        worker = worker_class(**kwargs)
        await worker
        finished = asyncio.ensure_future(worker.finished())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([finished, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not finished.done():
            from . import close_timeout_s

            await worker.close(timeout=close_timeout_s(options, node, device_memory))
        stopped.cancel()

    # each nanny hands the config of the moment it starts its worker to the worker process
    with dask.config.set(worker_config(options, tiered_store=uses_tiered_store(options))):
        asyncio.run(serve())
