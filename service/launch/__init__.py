"""Start (or attach to) a cluster from an :class:`~service.options.Options`.

``open_cluster(options)`` is the one way in: it plans against the GPU inventory (raising
:class:`~service.errors.OptionsError` before anything starts), starts the local GPU or
CPU cluster or attaches to a running scheduler, registers spillway's worker plugin and
yields a :class:`Session`. Leaving the context shuts down what it started.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..gpus import Inventory, discover
from ..options import Options
from ..plugins import WorkerSetup
from .deaths import start_failure, watch_worker_deaths
from .plan import LaunchPlan, plan

logger = logging.getLogger("spillway")

#: seconds the workers of a new cluster have to register (a pinned pool of tens of GB
#: takes about half a minute per worker to take)
START_TIMEOUT_S = 120

__all__ = ["Session", "open_cluster", "plan", "LaunchPlan"]


@dataclass
class Session:
    client: Any
    cluster: Any
    plan: LaunchPlan
    options: Options
    #: "gpu" or "cpu": what the workers compute on (read from the workers when attached)
    kind: str
    n_workers: int

    @property
    def scheduler_address(self) -> str:
        return self.client.scheduler.address

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:
            return None

    def write_scheduler_file(self, path: str) -> None:
        self.client.write_scheduler_file(path)


def start_cluster(options: Options, launch: LaunchPlan):
    """The cluster object for a local plan (None when attaching)."""
    if launch.kind == "gpu":
        from . import local_gpu

        return local_gpu.start(options, launch)
    if launch.kind == "cpu":
        from . import local_cpu

        return local_cpu.start(options, launch)
    return None


def connect_client(options: Options, cluster=None):
    from distributed import Client

    if cluster is not None:
        return Client(cluster, security=options.security)
    if options.scheduler_file:
        return Client(scheduler_file=options.scheduler_file, security=options.security, timeout="30s")
    return Client(options.scheduler_address, security=options.security, timeout="30s")


def setup_workers(client, options: Options, *, wait_for: int | None = None, timeout: float = 120) -> tuple[str, int]:
    """Register the worker plugin and return (kind, number of workers)."""
    if wait_for:
        client.wait_for_workers(wait_for, timeout=timeout)
    client.register_plugin(WorkerSetup(prefetch=options.prefetch, spill_on_demand=options.spill_on_demand))
    kinds = client.run(_worker_kind)
    if not kinds:
        raise RuntimeError(f"scheduler {client.scheduler.address} has no workers")
    values = set(kinds.values())
    if len(values) > 1:
        raise RuntimeError(f"mixed GPU and CPU workers are not supported: {kinds}")
    return values.pop(), len(kinds)


def _arrived(client) -> int | None:
    try:
        return len(client.scheduler_info(n_workers=-1)["workers"])
    except Exception:  # the scheduler may be gone too
        return None


def close_cluster(cluster) -> None:
    """Close a cluster spillway started. A worker process that outlives the nanny's close
    timeout after its work is done is killed, and the close goes on: waiting longer would
    not keep anything (a worker that pinned 48 GB of host memory beside a 126 GB RMM pool
    took over 5 s to exit on the GPU host, and distributed then raised TimeoutError)."""
    try:
        cluster.close()
    except TimeoutError:
        logger.warning("closing the cluster: a worker process did not exit within distributed's close "
                       "timeout and was killed (workers with large pinned or RMM pools take longer to exit)")


def _worker_kind(dask_worker):
    from ..plugins import PLUGIN_NAME

    return dask_worker.plugins[PLUGIN_NAME].kind


@contextlib.contextmanager
def open_cluster(options: Options, *, inventory: Inventory | None = None) -> Iterator[Session]:
    inventory = discover() if inventory is None and not options.attach else inventory or Inventory()
    launch = plan(options, inventory)
    for note in launch.notes:
        logger.warning(note)
    with contextlib.ExitStack() as stack:
        deaths = stack.enter_context(watch_worker_deaths())
        cluster = start_cluster(options, launch)
        if cluster is not None:
            stack.callback(close_cluster, cluster)
        client = connect_client(options, cluster)
        stack.callback(client.close)
        expected = launch.n_workers or 1
        try:
            kind, n = setup_workers(client, options, wait_for=expected, timeout=START_TIMEOUT_S)
        except TimeoutError as e:
            raise start_failure(expected, _arrived(client), START_TIMEOUT_S, deaths.messages) from e
        yield Session(client=client, cluster=cluster, plan=launch, options=options, kind=kind, n_workers=n)
