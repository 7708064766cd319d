"""The workers and the scheduler settle Python's collector (option gc-freeze): once the
cluster is ready, and at a quiet moment after a full collection, never while busy."""

from __future__ import annotations

import gc

import pytest

from spillway import upstream
from spillway.launch import collector


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def settler(busy, full, clock, calls):
    return collector.QuietSettler(busy=lambda: busy[0], clock=clock, full_collections=lambda: full[0],
                                  settle_now=lambda: calls.append(clock()) or {"seconds": 0.1, "frozen": 1},
                                  quiet_s=1.0, gap_s=30.0)


def test_a_full_collection_is_followed_by_a_settle_at_the_first_quiet_moment():
    busy, full, clock, calls = [False], [0], Clock(), []
    s = settler(busy, full, clock, calls)
    for t in (0.0, 0.5, 1.5, 2.5):  # quiet, but no full collection since the start
        clock.now = t
        assert not s.tick()
    full[0] = 1  # a run paid a full collection
    busy[0] = True
    clock.now = 3.0
    assert not s.tick()
    busy[0] = False
    clock.now = 3.5
    assert not s.tick()  # quiet for 0 s
    clock.now = 4.4
    assert not s.tick()  # 0.9 s
    clock.now = 4.6
    assert s.tick() and calls == [4.6]
    assert s.settles == [{"seconds": 0.1, "frozen": 1}]


def test_busy_spells_restart_the_quiet_wait_and_settles_keep_their_gap():
    busy, full, clock, calls = [False], [1], Clock(), []
    s = settler(busy, full, clock, calls)
    s.settled()  # the cluster's first settle, from outside
    assert s.seen == 1
    full[0] = 2
    clock.now = 10.0
    s.tick()
    clock.now = 20.0
    assert not s.tick()  # quiet long enough, but 20 s after the last settle
    clock.now = 30.5
    busy[0] = True
    assert not s.tick()
    busy[0] = False
    clock.now = 31.0
    assert not s.tick()
    clock.now = 31.8
    assert not s.tick()  # 0.8 s quiet since the busy spell
    clock.now = 32.1
    assert s.tick() and calls == [32.1]
    clock.now = 40.0
    assert not s.tick()  # no full collection since


def test_runs_sent_back_to_back_keep_a_process_from_settling_between_its_looks():
    # each run shorter than a look's interval: the looks alone would see a quiet process
    busy, full, clock, calls = [False], [1], Clock(), []
    s = settler(busy, full, clock, calls)
    full[0] = 2  # the runs paid a full collection
    for k in range(40):
        clock.now = k * 0.5
        s.touch()  # a task's transition between two looks
        clock.now = k * 0.5 + 0.45
        assert not s.tick()
    clock.now += 1.1  # the client stopped sending
    assert s.tick() and len(calls) == 1


_SETTLE_PROBE = """
import gc, weakref
from spillway.launch import collector

class Cycle:
    pass

dead, alive = Cycle(), Cycle()
dead.me, alive.me = dead, alive
dead_ref, alive_ref = weakref.ref(dead), weakref.ref(alive)
del dead
result = collector.settle()
assert dead_ref() is None, "garbage at the settle: collected, not frozen"
assert result["frozen"] > 0 and gc.get_freeze_count() > 0
del alive
gc.collect()
assert alive_ref() is not None, "frozen: a collection during a run does not walk it"
collector.settle()
assert alive_ref() is None, "the next settle unfreezes first and finds it"
print("ok")
"""


def test_settle_freezes_what_is_alive_and_the_next_finds_a_frozen_cycle_dropped_since():
    # in a process of its own: a cluster's settler in this one could settle meanwhile
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SETTLE_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_scheduler_is_busy_while_a_task_is_queued_or_processing():
    class WS:
        def __init__(self, processing):
            self.processing = processing

    class Sched:
        queued = ()
        unrunnable = {}
        workers = {"a": WS(set()), "b": WS(set())}

    s = Sched()
    assert not upstream.scheduler_busy(s)
    s.workers["b"].processing = {"task"}
    assert upstream.scheduler_busy(s)
    s.workers["b"].processing = set()
    s.queued = ("task",)
    assert upstream.scheduler_busy(s)


@pytest.mark.parametrize("gc_freeze", [True, False])
def test_a_local_cluster_settles_its_workers_and_scheduler_when_asked(gc_freeze):
    import spillway

    with spillway.local(cpu=True, n_workers=2, threads_per_worker=1, gc_freeze=gc_freeze,
                        dashboard_address="") as lc:
        client = lc.client

        def seen(dask_worker):
            s = collector.settler_of(dask_worker)
            return gc.get_freeze_count(), None if s is None else len(s.settles)

        workers = client.run(seen)
        scheduler = client.run_on_scheduler(
            lambda dask_scheduler: (gc.get_freeze_count(), collector.settler_of(dask_scheduler) is not None))
    gc.unfreeze()
    assert len(workers) == 2
    if gc_freeze:
        assert all(frozen > 1000 and settles == 1 for frozen, settles in workers.values()), workers
        assert scheduler[0] > 1000 and scheduler[1], scheduler
    else:
        assert all(frozen == 0 and settles is None for frozen, settles in workers.values()), workers
        assert not scheduler[1]


def test_serve_stops_the_settles_of_a_scheduler_in_its_own_process_only():
    """`spillway serve` runs a cluster's scheduler it started in its own process, beside the
    API's event loop: the scheduler's quiet settles (full collections of the process) are
    stopped there, its first settle kept; the workers keep theirs."""
    import spillway
    from spillway.cli.serve import _no_settles_beside_the_api

    def periodic(dask_worker=None, dask_scheduler=None):
        server = dask_worker or dask_scheduler
        return "spillway-gc-settle" in server.periodic_callbacks, gc.get_freeze_count()

    with spillway.local(cpu=True, n_workers=1, threads_per_worker=1, gc_freeze=True, dashboard_address="") as lc:
        client = lc.client
        assert client.run_on_scheduler(periodic)[0]
        _no_settles_beside_the_api(client)
        on_scheduler, frozen = client.run_on_scheduler(periodic)
        workers = client.run(periodic)
    gc.unfreeze()
    assert not on_scheduler and frozen > 1000
    assert all(settling for settling, _ in workers.values()), workers


def test_serve_keeps_the_settles_of_a_scheduler_of_another_process():
    from spillway.cli.serve import _no_settles_beside_the_api

    class Elsewhere:  # a client whose scheduler runs in another process
        def __init__(self):
            self.asked = []

        def run_on_scheduler(self, fn):
            self.asked.append(fn.__name__)
            return ("another-host", 1) if fn is collector.process_id else True

    client = Elsewhere()
    _no_settles_beside_the_api(client)
    assert client.asked == ["process_id"]


def test_stop_settling_stops_and_forgets_the_callback():
    class Callback:
        stopped = False

        def stop(self):
            self.stopped = True

    class Server:
        def __init__(self):
            self.periodic_callbacks = {"spillway-gc-settle": Callback(), "other": Callback()}

    server = Server()
    callback = server.periodic_callbacks["spillway-gc-settle"]
    assert collector.stop_settling(dask_scheduler=server) is True
    assert callback.stopped and list(server.periodic_callbacks) == ["other"]
    assert collector.stop_settling(dask_scheduler=server) is False
