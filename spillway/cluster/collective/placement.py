"""The scheduler's side of the collective: where the output chunks are assembled, and the
leftovers of an exchange that ended.

An assembly depends on its barrier alone, whose small result sits on one worker: left to
itself, dask would run every assembly there. As a barrier ends, before its dependents are
scheduled, :class:`CollectivePlacement` spreads them over the running workers in
contiguous runs of dask's order (any worker can assemble any output: it takes its pieces
from wherever they are, so this only balances the work and the memory). The restriction
is loose: a worker that leaves hands its assemblies to the others, which then find the
pieces it held gone and fail the computation with one line.

When a barrier is released or forgotten (its assemblies done, or the computation stopped,
failed or cancelled), the workers that cut for it drop whatever pieces are left.
"""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import SchedulerPlugin

from .exchange import DROP

logger = logging.getLogger("spillway.collective")

PLUGIN_NAME = "spillway-collective"
#: key names of the collective's tasks
BARRIER_PREFIX = "spillway-barrier-"
PIECES_PREFIX = "spillway-pieces-"


def pieces_name(barrier_key) -> str:
    """The name of the pieces of the partial whose barrier is ``barrier_key``."""
    name, partial = barrier_key
    return f"{PIECES_PREFIX}{name.removeprefix(BARRIER_PREFIX)}-{partial}"


def is_barrier(key) -> bool:
    return type(key) is tuple and bool(key) and isinstance(key[0], str) and key[0].startswith(BARRIER_PREFIX)


def spread(dependents: list, workers: list[str]) -> dict:
    """Each of ``dependents`` (in dask's order) -> a worker: contiguous runs, one a worker."""
    n, w = len(dependents), len(workers)
    return {d: workers[k * w // n] for k, d in enumerate(dependents)} if n and w else {}


class CollectivePlacement(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.scheduler = None
        #: barrier key -> the workers that cut for it
        self._holders: dict = {}

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if not is_barrier(key) or self.scheduler is None:
            return
        if finish == "memory":
            self._place(key)
        elif finish in ("released", "forgotten", "erred"):
            self._drop(key)

    def _place(self, key) -> None:
        ts = self.scheduler.tasks.get(key)
        if ts is None:
            return
        self._holders[key] = {ws.address for dts in ts.dependencies for ws in (dts.who_has or ())}
        workers = sorted(ws.address for ws in self.scheduler.running)
        waiting = sorted((d for d in ts.dependents if d.state in ("waiting", "released")),
                         key=lambda d: d.priority or ())
        for dts, address in spread(waiting, workers).items():
            # the attributes ``Scheduler.set_restrictions`` sets, and the loose flag that
            # dask's ``allow_other_workers`` annotation sets
            dts.worker_restrictions = {address}
            dts.loose_restrictions = True

    def _drop(self, key) -> None:
        holders = self._holders.pop(key, None)
        if not holders:
            return
        name = pieces_name(key)
        for address in holders:
            if address in self.scheduler.workers:
                self.scheduler.worker_send(address, {"op": DROP, "name": name})
