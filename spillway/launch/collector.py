"""Python's garbage collector kept out of the runs (option ``gc-freeze``).

A full (generation 2) collection walks every object its process tracks. In a GPU worker the
modules of CuPy, Numba, RMM, UCXX and distributed are millions of objects, and on the H200
host each full collection paused a worker for 0.10-0.17 s and the local scheduler's process
(the client's, in a notebook) for 0.11-0.12 s, about once per few runs (the bench's `gc
pauses`). A run pays it whole: a collective waits for its slowest worker, so W3's and W4's
slowest runs were one worker computing 0.15-0.19 s longer than its peer.

So each process is *settled*: everything alive is moved to the permanent generation
(:func:`gc.freeze`) and the full collections during later runs walk only what was made
since. A settle is itself a full collection, of the frozen objects too (:func:`gc.unfreeze`
first, so cyclic garbage among them is found), and it runs only where nothing is waiting on
the process: once when the cluster is ready, and again at a quiet moment (no task, no
transfer for :data:`QUIET_S`) after a full collection ran since the last settle, at most
once per :data:`GAP_S`. Where the scheduler shares its process with `spillway serve`'s API,
the quiet settles are stopped (:func:`stop_settling`): quiet for the scheduler is not quiet
for the API's event loop, which each one held for 0.12-0.17 s.
"""

from __future__ import annotations

import gc
import math
import time
import weakref
from typing import Callable

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import upstream

#: how long a process has had nothing to do before it is settled again
QUIET_S = 1.0
#: the least time between two settles of one process (each is a full collection)
GAP_S = 30.0
#: how often a process looks whether it may settle
TICK_MS = 500


def settle() -> dict:
    """Collect everything, then freeze what is alive: the seconds it took and the objects
    now frozen."""
    began = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return {"seconds": time.perf_counter() - began, "frozen": gc.get_freeze_count()}


def _full_collections() -> int:
    return gc.get_stats()[2]["collections"]


class QuietSettler:
    """Settles its process again at the first quiet moment after a full collection ran in
    it: objects that outlived the runs (compiled kernels, FFT plans, a scheduler's task
    states) have grown what each full collection walks. ``tick`` is called on the event
    loop every :data:`TICK_MS`; ``busy()`` says whether a task or a transfer is under way."""

    def __init__(self, busy: Callable[[], bool], *, quiet_s: float = QUIET_S, gap_s: float = GAP_S,
                 clock: Callable[[], float] = time.monotonic,
                 full_collections: Callable[[], int] = _full_collections,
                 settle_now: Callable[[], dict] = settle):
        self.busy = busy
        self.quiet_s = quiet_s
        self.gap_s = gap_s
        self.clock = clock
        self.full_collections = full_collections
        self.settle_now = settle_now
        self.quiet_since: float | None = None
        #: the latest task transition (:meth:`touch`): a look every TICK_MS alone would
        #: miss the runs a client sends back to back, each shorter than a look's interval
        self.active_at = -math.inf
        self.settled_at = -math.inf
        self.seen = full_collections()
        self.settles: list[dict] = []

    def settled(self, result: dict | None = None) -> None:
        """A settle ran (here or from outside, as the cluster's first one does)."""
        self.settled_at = self.clock()
        self.seen = self.full_collections()
        if result is not None:
            self.settles.append(result)
            del self.settles[:-16]

    def touch(self) -> None:
        """A task changed state here (called from the plugins' transition hooks)."""
        self.active_at = self.clock()

    def tick(self) -> bool:
        now = self.clock()
        if self.busy():
            self.quiet_since = None
            return False
        if self.quiet_since is None:
            self.quiet_since = now
        quiet_for = now - max(self.quiet_since, self.active_at)
        if quiet_for < self.quiet_s or now - self.settled_at < self.gap_s:
            return False
        if self.full_collections() == self.seen:
            return False
        self.settled(self.settle_now())
        return True


#: each server's (worker's, scheduler's) settler, kept here rather than on distributed's object
_settlers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def settler_of(server) -> QuietSettler | None:
    """The :class:`QuietSettler` ticking on ``server`` (:func:`start_settling`), or None."""
    return _settlers.get(server)


def start_settling(server, busy: Callable[[], bool], name: str = "spillway-gc-settle") -> QuietSettler:
    """A :class:`QuietSettler` ticking on ``server``'s event loop (a worker or a scheduler:
    its periodic callbacks stop with it)."""
    from tornado.ioloop import PeriodicCallback

    settler = QuietSettler(busy)
    callback = PeriodicCallback(settler.tick, TICK_MS)
    server.periodic_callbacks[name] = callback
    callback.start()
    _settlers[server] = settler
    return settler


def stop_settling(dask_worker=None, dask_scheduler=None, name: str = "spillway-gc-settle") -> bool:
    """Stop the quiet settles of a worker or a scheduler (``client.run_on_scheduler``);
    whether it had them. Its first settle stays: what was frozen then stays frozen."""
    server = dask_worker or dask_scheduler
    callback = server.periodic_callbacks.pop(name, None)
    if callback is None:
        return False
    callback.stop()
    return True


def process_id() -> tuple[str, int]:
    """This host's name and this process's id: ``client.run_on_scheduler(process_id)``
    against the caller's own says whether the scheduler runs in the caller's process."""
    import os
    import socket

    return socket.gethostname(), os.getpid()


def settle_server(dask_worker=None, dask_scheduler=None) -> dict:
    """The cluster's first settle of a worker or a scheduler (``client.run`` /
    ``run_on_scheduler``), told to its :class:`QuietSettler` where it has one."""
    result = settle()
    settler = settler_of(dask_worker or dask_scheduler)
    if settler is not None:
        settler.settled(result)
    return result


class SchedulerSettle(SchedulerPlugin):
    """The scheduler's process settled at its quiet moments (for ``spillway.local()`` that
    is the notebook's own process, where the local scheduler runs)."""

    name = "spillway-gc-settle"
    idempotent = True

    settler: QuietSettler | None = None

    async def start(self, scheduler):
        self.settler = start_settling(scheduler, lambda: upstream.scheduler_busy(scheduler))

    def transition(self, key, start, finish, *args, **kwargs):
        if self.settler is not None:
            self.settler.touch()
