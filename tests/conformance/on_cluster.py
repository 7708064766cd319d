"""What the conformance plugins share: dask's ``assert_eq`` computing on the cluster, the
count of the tasks the cluster ran for each test, and the wait for a test's keys to be
released before the next one starts.

dask's ``assert_eq`` computes with ``scheduler="sync"`` unless told otherwise, and most of
dask's array tests check their values through it alone: without :func:`assert_eq_on_cluster`
they pass without a task reaching a worker. The counts show each test did run there.
"""

from __future__ import annotations

import contextlib
import time

from distributed.diagnostics.plugin import SchedulerPlugin

#: the name the task counter is registered under on the scheduler
COUNTER = "conformance-task-counts"


@contextlib.contextmanager
def assert_eq_on_cluster():
    """``dask.array.utils.assert_eq`` computes on dask's default scheduler (the cluster's
    client) inside this block. Its default is changed in place, not the name replaced:
    dask's test modules hold the function itself (``from dask.array.utils import
    assert_eq``), and a test that names its own scheduler keeps it."""
    from dask.array import utils

    defaults = utils.assert_eq.__defaults__
    names = utils.assert_eq.__code__.co_varnames[2:utils.assert_eq.__code__.co_argcount]
    at = names.index("scheduler")
    if defaults[at] != "sync":
        raise RuntimeError(f"dask's assert_eq defaults to scheduler={defaults[at]!r}, not 'sync': "
                           "check what it computes on before changing it")
    utils.assert_eq.__defaults__ = (*defaults[:at], None, *defaults[at + 1:])
    try:
        yield
    finally:
        utils.assert_eq.__defaults__ = defaults


class TaskCounts(SchedulerPlugin):
    """The tasks the scheduler saw run to the end on a worker (to memory or to an error),
    since the last :func:`take_counts`."""

    name = COUNTER

    def __init__(self):
        self.ran = 0
        self.erred = 0

    def transition(self, key, start, finish, *args, **kwargs):
        if start == "processing" and finish == "memory":
            self.ran += 1
        elif start == "processing" and finish == "erred":
            self.erred += 1


def count_tasks(client) -> None:
    client.register_plugin(TaskCounts(), name=COUNTER)


def take_counts(client) -> dict:
    """The counts since the last call, which starts them again from zero."""
    return client.run_on_scheduler(_take)


def _take(dask_scheduler=None) -> dict:
    counts = dask_scheduler.plugins[COUNTER]
    taken = {"ran": counts.ran, "erred": counts.erred}
    counts.ran = counts.erred = 0
    return taken


def held_keys(client) -> set:
    """The keys the scheduler holds now."""
    return client.run_on_scheduler(_keys)


def wait_released(client, seconds: float = 3, held: set | None = None) -> None:
    """Wait (``seconds`` at most) until the scheduler holds no task but those of ``held``
    (:func:`held_keys` before the test: what an earlier test keeps for the session, a
    module's cached array, is not this test's to wait for, and waiting for it would cost
    every later test the whole wait). A test that names its keys (dask's
    ``test_tsqr_uncertain``: ``"A"``, ``"c"``, ``"r"`` in every case) would otherwise take a
    key the last test left as already computed."""
    deadline = time.monotonic() + seconds
    while client.run_on_scheduler(_keys) - (held or set()) and time.monotonic() < deadline:
        time.sleep(0.02)


@contextlib.contextmanager
def one_test(client, node, *, release: bool = True):
    """Around one test: the tasks the scheduler ran for it, recorded on its report
    (``node.user_properties``: ``tasks``) and yielded (a dict, filled once the test ends),
    and, where ``release``, a wait until the keys it made are let go (:func:`wait_released`)."""
    take_counts(client)
    held = held_keys(client)
    counts: dict = {}
    yield counts
    counts.update(take_counts(client))
    node.user_properties.append(("tasks", counts))
    if release:
        wait_released(client, held=held)


def _keys(dask_scheduler=None) -> set:
    return set(dask_scheduler.tasks)
