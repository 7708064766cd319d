"""When does this worker need a key next? Read from the tasks queued on it, and from
what the scheduler said last of the tasks it has not sent yet.

A key's rank is the smallest priority among its dependents that still wait, are ready or
run here (dask priorities: smaller runs sooner). A worker knows only the tasks sent to
it: a key whose readers the scheduler still queues (root-ish tasks past the workers'
saturation) or runs on another worker (a rechunk's pieces) looks needed by no one, and an
order of "no one first" then writes to disk the values needed next and reads them back.
So the scheduler says, for each key a worker holds, the soonest priority of the tasks
still waiting for it anywhere (:func:`waiting_for`, its :class:`NextUse` handler), and the
worker asks again every few hundred milliseconds while its store spills
(:class:`SchedulerRanks`). A key with no reader anywhere ranks None: it is only kept for
a later gather, so it is the first to leave; one the scheduler had not heard of when it
last answered (just computed) ranks as needed soonest until it has.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import upstream

#: the scheduler handler that says what waits for a worker's keys
NEXT_USE = "spillway_next_use"
#: the rank of a key the scheduler had not heard of when it last answered: before any
#: priority (dask's are tuples of ints), so such a key stays until the next answer
SOONEST = (float("-inf"),)
#: the least time between two asks, and the share of it one answer may cost the worker
ASK_EVERY_S = 0.25
ASK_SHARE = 0.05
#: the most time between two asks: an answer's time counts the scheduler's queue too, and
#: one slowed by a large graph's arrival (a second) would otherwise leave the worker's
#: ranks twenty seconds old through the graph's run
ASK_MOST_S = 2.0


def next_use(worker, far: SchedulerRanks | None = None) -> Callable[[Hashable], tuple | None]:
    """The rank callable of ``worker``'s store: the soonest of its local readers and,
    where given, of those the scheduler said last (``far``)."""
    local = upstream.local_readers_rank(worker)

    def rank(key):
        best = local(key)
        said = far.rank(key) if far is not None else None
        if said is None:
            return best
        return said if best is None or said < best else best

    return rank


class SchedulerRanks:
    """What the scheduler said last of the keys this worker holds (:func:`waiting_for`):
    key -> the soonest priority of a task still waiting for it, or None for none. Replaced
    whole by each answer (read from the store's threads, written by the event loop)."""

    def __init__(self):
        #: None until the first answer (then the worker's own tasks alone rank keys)
        self.ranks: dict | None = None
        self.asked_at = 0.0
        self.cost_s = 0.0
        #: False once the scheduler has no such handler (a cluster without spillway's plugin)
        self.answered = True

    def rank(self, key):
        ranks = self.ranks
        if ranks is None:
            return None
        return ranks.get(key, SOONEST)

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.answered and now - self.asked_at >= max(ASK_EVERY_S, min(ASK_MOST_S, self.cost_s / ASK_SHARE))

    def take(self, keys, priorities, cost_s: float) -> None:
        self.ranks = {k: (tuple(p) if p is not None else None) for k, p in zip(keys, priorities)}
        self.cost_s = cost_s

    async def ask(self, worker) -> None:
        """Ask the scheduler (on the worker's event loop); a scheduler without the handler
        is not asked again."""
        self.asked_at = began = time.monotonic()
        try:
            answer = await worker.scheduler.spillway_next_use(worker=worker.address)
        except Exception:  # noqa: BLE001 (the scheduler away for now: asked again later)
            return
        if not isinstance(answer, dict):  # no such handler there (its comm answers None)
            self.answered = False
            return
        self.take(answer["keys"], answer["priorities"], time.monotonic() - began)


def waiting_for(scheduler, worker: str) -> dict:
    """On the scheduler: for each key ``worker`` holds, the soonest priority of the tasks
    still waiting for it, on any worker or none yet (None where no task does)."""
    keys, priorities = upstream.waiting_priorities(scheduler, worker)
    return {"keys": keys, "priorities": priorities}


class NextUse(SchedulerPlugin):
    """The scheduler's side of :class:`SchedulerRanks`: the :data:`NEXT_USE` handler."""

    name = "spillway-next-use"
    idempotent = True

    async def start(self, scheduler) -> None:
        scheduler.handlers[NEXT_USE] = lambda worker=None: waiting_for(scheduler, worker)


def running_inputs(worker) -> Callable[[], set]:
    """The keys that tasks running here are reading (and the running tasks' own keys)."""
    return lambda: upstream.keys_in_use(worker)


def upcoming_inputs(worker, n_tasks: int = 8) -> Iterator[Hashable]:
    """Inputs of the next ``n_tasks`` tasks to run here, soonest first."""
    yield from upstream.queued_inputs(worker, n_tasks)
