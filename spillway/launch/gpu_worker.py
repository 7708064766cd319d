"""The GPU workers of one node of a cluster spillway did not start locally: ``spillway
worker`` in a batch job, and each MPI worker rank.

dask-cuda's ``CUDAWorker`` (what ``dask cuda worker`` runs) starts one nanny per visible
GPU with its RMM pool, CPU affinity, UCX settings and ``CUDA_VISIBLE_DEVICES``, but picks
the workers' ``data`` itself (its own device/host store) and has no keyword or flag for
another. :class:`TieredCUDAWorker` is that worker with one change: before its nannies
start, each one's worker keywords get spillway's tiered store (:func:`use_store`), the
same ``(build_store, kwargs)`` the local GPU cluster passes. distributed's ``--preload``
is no way in: preloads start after the worker is built and listening, and the worker's
state keeps the store it was built with. With ``workers-per-gpu`` above 1 it starts that
many nannies on each GPU (:func:`shared_gpus`), each set up for its GPU as dask-cuda sets
up the one worker of a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Iterator

from spillway import upstream
from spillway.options.gpus import Inventory
from spillway.options.settings import Options
from .plan import HostProbe, LaunchPlan, plan
from .render import cuda_worker_kwargs
from .spec import WorkerSpec, one_for_all, worker_specs

logger = logging.getLogger("spillway")

#: seconds a worker waits for a lost scheduler before it exits, so a worker whose
#: scheduler died does not hold its node until the wall time
DEATH_TIMEOUT_S = 60
#: the import path of :class:`TieredCUDAWorker`, as a launcher that builds workers by
#: their class's name takes it (dask-mpi)
TIERED_WORKER = f"{__name__}.TieredCUDAWorker"


def visible_gpus() -> int | None:
    """How many GPUs this process may use (``CUDA_VISIBLE_DEVICES``, as Slurm sets it for
    the task); None where it is unset (all of them)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip()])


def node_plan(options: Options, inventory: Inventory, host: HostProbe, *, workers: int | None = None) -> LaunchPlan:
    """The plan of this node's ``workers`` GPU workers (default: ``workers-per-gpu`` on
    each GPU), with the
    node's pinned-memory bound shared among them. The scheduler and the job's total
    worker count belong to the job, not to the node, so they are left out here."""
    from spillway.options.errors import OptionsError

    if options.cpu or not len(inventory):
        why = "cpu is true" if options.cpu else f"no GPU found ({inventory.reason})"
        raise OptionsError(f"worker: {why}; spillway worker starts GPU workers, run CPU workers with `dask worker`")
    local = options.replace(scheduler_address=None, scheduler_file=None, n_workers=workers, devices=None)
    found = plan(local, inventory, host)
    if found.kind != "gpu":
        raise OptionsError(f"worker: {'; '.join(found.notes)}")
    return found


def worker_kwargs(options: Options, spec: WorkerSpec, *, death_timeout: float = DEATH_TIMEOUT_S,
                  name: str | None = None) -> dict:
    """:class:`TieredCUDAWorker` keywords for this node's workers of ``spec``, attached to
    the scheduler of ``options`` (``data`` only with the tiered store); ``name`` names
    them (CUDAWorker names nanny i ``name-i`` where it starts several)."""
    kwargs = dict(cuda_worker_kwargs(spec), death_timeout=death_timeout)
    if name is not None:
        kwargs["name"] = name
    if options.scheduler_file:
        kwargs["scheduler_file"] = options.scheduler_file
    elif options.scheduler_address:
        kwargs["scheduler"] = options.scheduler_address
    return kwargs


def repeated(visible: list[str], workers_per_gpu: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` naming each GPU once per worker of it: what CUDAWorker is
    built under so that it starts that many nannies, the workers of a GPU next to each
    other."""
    return ",".join(d for d in visible for _ in range(workers_per_gpu))


def deduplicated(visible: str) -> str:
    """A nanny's ``CUDA_VISIBLE_DEVICES`` with each GPU once, in order: CUDAWorker gives
    nanny i the list rotated to start at entry i, so with each GPU named once per worker
    its GPU still comes first and the others follow in dask-cuda's order."""
    return ",".join(dict.fromkeys(d.strip() for d in visible.split(",") if d.strip()))


@contextlib.contextmanager
def shared_gpus(workers_per_gpu: int) -> Iterator[None]:
    """Build CUDAWorker within this context to start ``workers_per_gpu`` nannies on each
    GPU the process may use; :func:`fix_visible` afterwards gives each nanny its GPU list."""
    if workers_per_gpu == 1:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if saved is not None:
        visible = [d.strip() for d in saved.split(",") if d.strip()]
    else:
        from spillway.options.gpus import discover

        visible = [str(g.index) for g in discover().gpus]
    os.environ["CUDA_VISIBLE_DEVICES"] = repeated(visible, workers_per_gpu)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def fix_visible(nannies: Iterable) -> None:
    """Each GPU once in each nanny's ``CUDA_VISIBLE_DEVICES`` (:func:`deduplicated`)."""
    for nanny in nannies:
        env = upstream.nanny_env(nanny)
        if env is not None and env.get("CUDA_VISIBLE_DEVICES"):
            env["CUDA_VISIBLE_DEVICES"] = deduplicated(env["CUDA_VISIBLE_DEVICES"])


def use_store(nannies: Iterable, data) -> None:
    """Give the workers of ``nannies`` (not started yet) ``data`` instead of the store
    they were built with: a nanny passes its worker keywords to the worker process it
    starts."""
    for nanny in nannies:
        kwargs = upstream.nanny_worker_kwargs(nanny)
        if kwargs is None:
            raise RuntimeError(f"{type(nanny).__name__} keeps no worker keywords: this distributed "
                               "cannot be given spillway's tiered store; use memory-store dask-cuda")
        kwargs["data"] = data


def _worker_class():
    from dask_cuda import CUDAWorker

    class TieredCUDAWorker(CUDAWorker):
        """dask-cuda's ``CUDAWorker`` whose workers are built with ``data``,
        ``workers_per_gpu`` of them on each visible GPU."""

        def __init__(self, *args, data=None, workers_per_gpu: int = 1, **kwargs):
            with shared_gpus(workers_per_gpu):
                super().__init__(*args, **kwargs)
            fix_visible(upstream.nannies_of(self))
            if data is not None:
                use_store(upstream.nannies_of(self), data)

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


class NodeWorkers:
    """Backend of ``spillway worker``: this node's GPU workers (:class:`TieredCUDAWorker`,
    one set of keywords for the node's ``specs``), attached to the scheduler of the
    options; :meth:`start` serves until they end (their lifetime, a lost scheduler) or
    SIGTERM/SIGINT, which closes them."""

    def __init__(self, *, death_timeout: float = DEATH_TIMEOUT_S, name: str | None = None):
        self.death_timeout = death_timeout
        self.name = name

    def start(self, options: Options, launch: LaunchPlan, specs: tuple[WorkerSpec, ...]) -> None:
        import dask.config

        from .ucx_env import quiet_ucx
        from .worker_config import worker_config

        spec = one_for_all(specs)
        # the plan's memory is each worker's share; what a worker may hold is of its GPU
        device_memory = max(launch.device_memory, default=0) * spec.workers_per_gpu
        kwargs = worker_kwargs(options, spec, death_timeout=self.death_timeout, name=self.name)
        if spec.protocol == "ucx":
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
                from .closing import close_timeout_s

                await worker.close(timeout=close_timeout_s(spec, device_memory))
            stopped.cancel()

        # each nanny hands the config of the moment it starts its worker to the worker process
        with dask.config.set(worker_config(options, tiered_store=spec.tiered)):
            asyncio.run(serve())


def run_node(options: Options, *, death_timeout: float = DEATH_TIMEOUT_S, name: str | None = None) -> None:
    """``spillway worker``: plan this node's workers (one per GPU the task may use, times
    ``workers-per-gpu``) and serve them (:class:`NodeWorkers`), named ``name`` where given."""
    from spillway.options.gpus import discover

    inventory = discover()
    gpus = visible_gpus()
    node = node_plan(options, inventory, HostProbe.here(), workers=gpus * options.workers_per_gpu if gpus else None)
    NodeWorkers(death_timeout=death_timeout, name=name).start(options, node, worker_specs(options, node))
