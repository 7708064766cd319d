"""When does this worker need a key next? Read from the tasks queued on it.

A key's rank is the smallest priority among its dependents that still wait, are ready or
run here (dask priorities: smaller runs sooner). A key no local task waits for ranks None:
it is only kept for a transfer or a later gather, so it is the first to leave the device.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator

from .. import upstream

#: worker task states of dependents that will still read their inputs here
PENDING = frozenset({"waiting", "ready", "constrained", "executing", "long-running"})


def next_use(worker) -> Callable[[Hashable], tuple | None]:
    tasks = worker.state.tasks

    def rank(key):
        try:
            ts = tasks.get(key)
            if ts is None:
                return None
            best = None
            for dep in ts.dependents:
                if dep.state in PENDING and (best is None or dep.priority < best):
                    best = dep.priority
            return best
        except RuntimeError:  # the event loop changed the task graph while we looked
            return None

    return rank


def running_inputs(worker) -> Callable[[], set]:
    """The keys that tasks running here are reading (and the running tasks' own keys)."""
    state = worker.state

    def in_use() -> set:
        keys = set()
        for ts in list(state.executing) + list(state.long_running):
            keys.add(ts.key)
            keys.update(dep.key for dep in ts.dependencies)
        return keys

    return in_use


def upcoming_inputs(worker, n_tasks: int = 8) -> Iterator[Hashable]:
    """Inputs of the next ``n_tasks`` tasks to run here, soonest first."""
    seen = set()
    for ts in upstream.queued_tasks(worker.state, n_tasks):
        for dep in ts.dependencies:
            if dep.key not in seen:
                seen.add(dep.key)
                yield dep.key
