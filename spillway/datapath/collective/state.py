"""What the collective keeps between its tasks on one worker: one :class:`CollectiveState`
a worker, held by the worker's plugin (:mod:`.plugin`, added by the first collective task
there), and in it one :class:`ExchangeRun` an exchange. A run is dropped when the
scheduler says its exchange ended (the ``DROP`` of :mod:`.exchange`), and every run with
the worker when it closes (the plugin's teardown).

The pieces a worker cuts or takes are not here: they are values in its store, counted and
spilled like any other. Collectives run without a distributed worker (dask's local
schedulers) have no store and no plugin: their pieces wait in the runs of :data:`LOCAL`,
this process's one state for them.

Nothing here imports distributed: the local schedulers' path runs without it.
"""

from __future__ import annotations

import asyncio
import collections
import statistics
import threading
from collections import defaultdict

#: the name of the worker plugin that holds a worker's :class:`CollectiveState`
WORKER_PLUGIN = "spillway-collective-worker"


class Phases:
    """Where a worker's collective tasks spent their time since it started: per phase the
    seconds summed, the count, and the median of the latest :data:`KEPT` (the first run
    of an exchange pays for compiling the copy kernel and opening endpoints: the median
    is what a run costs after). A cut is ``layout`` (asked of the scheduler), ``cut_plan``
    (its buffers taken and its copies listed), ``cut_launch`` (the copies' one launch) and
    ``cut_store`` (kept in the store); an assembly is ``pieces`` (read where they are
    held here, else on the event loop: ``take``, from other workers, bytes in
    ``taken_bytes``, each request to one holder as ``take_plane`` or ``take_comm``;
    ``owned_store``, a grouped exchange's buffers kept here) and ``join`` (the output
    chunk's one launch). :func:`spillway.run.measuring.collective_phases` reads them.

    They belong to the worker, not to a run: they add up every exchange since the worker
    started, and are read after the exchanges' runs are gone."""

    KEPT = 1024

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.latest: dict[str, collections.deque] = defaultdict(lambda: collections.deque(maxlen=self.KEPT))
        self.taken_bytes = 0

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds
        self.counts[phase] += 1
        self.latest[phase].append(seconds)

    def as_dict(self) -> dict:
        return {"seconds": dict(self.seconds), "counts": dict(self.counts), "taken_bytes": self.taken_bytes,
                "median": {k: statistics.median(v) for k, v in self.latest.items() if v}}


class ExchangeRun:
    """One exchange (a pieces name: one partial of one rechunk) on one worker."""

    def __init__(self, name: str):
        self.name = name
        #: the layout the scheduler gave the exchange (:class:`.layout.PieceLayout`), asked once
        #: a worker; None until this worker asked
        self.layout = None
        #: held by the first assembly here while it takes every buffer packed for this
        #: worker, so that the assemblies after it find them here. Made on any thread, used
        #: on the worker's event loop (an asyncio lock binds to a loop when first waited on)
        self.first_assembly = asyncio.Lock()
        #: pieces cut without a distributed worker, until their assembly takes them
        self.pieces: dict = {}


class CollectiveState:
    """A worker's exchanges, and what its collective tasks measured."""

    def __init__(self):
        self._runs: dict[str, ExchangeRun] = {}
        #: cuts on several threads may make an exchange's run at once
        self._lock = threading.Lock()
        self.phases = Phases()
        #: requests on the worker's event loop telling holders to drop what was moved off
        #: them, kept referenced until they end (the loop holds its tasks weakly)
        self.pending: set = set()

    def run(self, name: str) -> ExchangeRun:
        """The exchange's run here, made by its first use."""
        with self._lock:
            found = self._runs.get(name)
            if found is None:
                found = self._runs[name] = ExchangeRun(name)
            return found

    def find(self, name: str) -> ExchangeRun | None:
        """The exchange's run here, None where nothing of it made one (a read makes none:
        a worker that only read would keep it, not being told the exchange ended)."""
        return self._runs.get(name)

    def drop(self, name: str) -> None:
        with self._lock:
            self._runs.pop(name, None)

    def names(self) -> list[str]:
        """The exchanges that have a run here."""
        return list(self._runs)

    def close(self) -> None:
        with self._lock:
            self._runs.clear()


#: the runs of collectives without a distributed worker (dask's local schedulers)
LOCAL = CollectiveState()


def state_of(worker) -> CollectiveState | None:
    """The worker's collective state, None where no collective ran on it."""
    plugin = getattr(worker, "plugins", {}).get(WORKER_PLUGIN)
    return None if plugin is None else plugin.state
