"""The scheduler's side of the collective: each exchange's layout, where its output
chunks are assembled, and the leftovers of an exchange that ended.

The first cut of an exchange asks for its layout (:mod:`.layout`): the running workers,
and whether the exchange is grouped (it fits the workers' fastest tier a few times over).
Every later ask gets the same answer. A client asks what the workers hold and their
fastest tiers (:meth:`CollectivePlacement.room`) before it builds a rechunk: one that
would not fit is dask's task method (:mod:`.way`).

An assembly depends on its barrier alone, whose small result sits on one worker: left to
itself, dask would run every assembly there. As a barrier ends, before its dependents are
scheduled, :class:`CollectivePlacement` puts each on the worker the layout gives its
output chunk (found from its key, or from the keys of the task it was fused into), and
spreads what it cannot place in contiguous runs of dask's order. Any worker can assemble
any output (it is handed the pieces), so this only saves moves and balances the work.
The restriction is loose: a worker that leaves hands its assemblies to the others, which
then find the pieces it held gone and fail the computation with one line.

When a barrier is released or forgotten (its assemblies done, or the computation stopped,
failed or cancelled), the workers that cut or assembled for it drop what is left of it,
told on the scheduler's stream to each worker: after everything sent before, before
anything of a later run of the same exchange.
"""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import SchedulerPlugin

from spillway import upstream
from spillway.upstream import fused_keys, restrict_loosely
from .exchange import DROP
from .layout import owner
from .names import BARRIER_PREFIX, OUTPUT_PREFIX, is_barrier, pieces_name

logger = logging.getLogger("spillway.collective")

PLUGIN_NAME = "spillway-collective"
LAYOUT = "spillway_collective_layout"
ROOM = "spillway_collective_room"
#: the states whose transitions the plugin acts on (an assembly's result, a barrier's end)
_ENDS = frozenset({"memory", "released", "forgotten", "erred"})


def spread(dependents: list, workers: list[str]) -> dict:
    """Each of ``dependents`` (in dask's order) -> a worker: contiguous runs, one a worker."""
    n, w = len(dependents), len(workers)
    return {d: workers[k * w // n] for k, d in enumerate(dependents)} if n and w else {}


class CollectivePlacement(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, fit_fraction: float | None = None):
        """``fit_fraction``: the option ``collective-group-fraction`` (its default where
        None): the largest share of the smallest fastest tier that a grouped exchange's
        bytes over the workers take (its packed buffers, the buffers an owner takes and
        the outputs then sit there together)."""
        from spillway.options.settings import Options

        self.scheduler = None
        self.fit_fraction = Options().collective_group_fraction if fit_fraction is None else fit_fraction
        #: barrier key -> the workers that hold its pieces: those that cut for it, and those
        #: that ran its assemblies (the workers told to drop what is left when it ends:
        #: each has the handler, having run a task of the exchange)
        self._holders: dict = {}
        #: assembly key -> its barrier's key, and barrier key -> its assemblies' keys
        self._assemblies: dict = {}
        self._members: dict = {}
        #: pieces name -> the layout its cuts were given ({"workers", "grouped", "grid"})
        self._layouts: dict = {}

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers[LAYOUT] = self.layout
        scheduler.handlers[ROOM] = self.room

    def room(self) -> dict:
        """What a client weighs a rechunk against before it builds one (:mod:`.way`): the
        bytes the workers hold, and their fastest tiers' bytes together."""
        from spillway.datapath.step.coordinator import PLUGIN_NAME as STEPS

        tiers = self._tiers()
        return {"held": upstream.held_bytes(self.scheduler),
                "fastest": sum(tiers), "smallest": min((t for t in tiers if t), default=0),
                "workers": len(upstream.worker_addresses(self.scheduler, running=True)),
                "steps": STEPS in self.scheduler.plugins}

    def layout(self, name=None, nbytes=0, grid=()) -> dict:
        found = self._layouts.get(name)
        if found is None:
            workers = sorted(upstream.worker_addresses(self.scheduler, running=True))
            found = {"workers": workers, "grid": list(grid),
                     "grouped": bool(workers) and nbytes / len(workers) <= self.fit_fraction * self._fastest_tier()}
            self._layouts[name] = found
        return found

    def _fastest_tier(self) -> float:
        known = [s for s in self._tiers() if s]
        return min(known) if known else float("inf")

    def _tiers(self) -> list[int]:
        """Each running worker's fastest tier: its device tier, else its host tier."""
        from spillway.memory.capacity import TIERS

        reports = upstream.worker_metric(self.scheduler, TIERS, running=True)
        limits = upstream.worker_memory_limits(self.scheduler, running=True)
        sizes = []
        for address, limit in limits.items():
            tiers = reports.get(address) or {}
            sizes.append(int(tiers.get("device") or tiers.get("host") or limit or 0))
        return sizes

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        # called for every transition of every task: those to waiting, queued or processing
        # are never an assembly's or a barrier's end, and leave before the key is looked at
        if finish not in _ENDS or self.scheduler is None:
            return
        if finish == "memory" and key in self._assemblies:
            # where an assembly ran holds what it took for good (a grouped exchange's
            # buffers) until the exchange ends
            ts = upstream.scheduler_task(self.scheduler, key)
            held = self._holders.get(self._assemblies[key])
            if ts is not None and held is not None:
                held.update(upstream.task_holders(ts))
            return
        if not is_barrier(key):
            return
        if finish == "memory":
            self._place(key)
        elif finish in ("released", "forgotten", "erred"):
            self._drop(key)

    def _place(self, key) -> None:
        ts = upstream.scheduler_task(self.scheduler, key)
        if ts is None:
            return
        self._holders[key] = upstream.dependency_holders(ts)
        running = set(upstream.worker_addresses(self.scheduler, running=True))
        waiting = sorted((d for d in upstream.task_dependents(ts)
                          if upstream.task_state(d) in ("waiting", "released")),
                         key=lambda d: upstream.task_priority(d) or ())
        self._assemblies.update((upstream.task_key(d), key) for d in waiting)
        self._members.setdefault(key, set()).update(upstream.task_key(d) for d in waiting)
        layout = self._layouts.get(pieces_name(key))
        placed, unplaced = {}, []
        if layout is not None and layout["grid"]:
            out_name = OUTPUT_PREFIX + key[0].removeprefix(BARRIER_PREFIX)
            grid = tuple(layout["grid"])
            for dts in waiting:
                index = output_index(dts, out_name, len(grid))
                address = None if index is None else layout["workers"][owner(index, grid, len(layout["workers"]))]
                if address in running:
                    placed[dts] = address
                else:
                    unplaced.append(dts)
        else:
            unplaced = waiting
        placed.update(spread(unplaced, sorted(running)))
        for dts, address in placed.items():
            restrict_loosely(dts, address)

    def _drop(self, key) -> None:
        name = pieces_name(key)
        self._layouts.pop(name, None)
        for done in self._members.pop(key, ()):
            self._assemblies.pop(done, None)
        holders = self._holders.pop(key, None)
        if not holders:
            return
        for address in holders:
            if upstream.has_worker(self.scheduler, address):
                self.scheduler.worker_send(address, {"op": DROP, "name": name})


def output_index(ts, out_name: str, ndim: int) -> tuple | None:
    """The output chunk a task assembles: from its key, or from the keys of the tasks
    dask fused into it."""
    key = upstream.task_key(ts)
    if type(key) is tuple and key and key[0] == out_name and len(key) == ndim + 1:
        return tuple(key[1:])
    for k in fused_keys(ts):
        if type(k) is tuple and k and k[0] == out_name and len(k) == ndim + 1:
            return tuple(k[1:])
    return None
