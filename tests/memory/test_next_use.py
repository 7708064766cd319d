"""A key's next use, as a worker's store ranks it: its own queued readers, and what the
scheduler says waits for the worker's keys anywhere (readers queued on the scheduler or
sent to other workers), asked over the worker's real comm."""

from __future__ import annotations

import time

import dask.array as da
import pytest
from distributed import Client, Event, LocalCluster, futures_of, wait

from spillway.memory.policy import SOONEST, NextUse, SchedulerRanks, next_use, waiting_for


class _Task:
    def __init__(self, priority=None, state="memory", dependents=()):
        self.priority, self.state, self.dependents = priority, state, set(dependents)


class _Worker:
    def __init__(self, tasks):
        self.state = type("State", (), {"tasks": tasks})()


def test_the_soonest_of_the_local_readers_and_the_scheduler_s_word_ranks_a_key():
    reader = _Task((0, 1, 7, -1), "waiting")
    tasks = {"local": _Task(dependents=[reader]), "remote": _Task(), "done": _Task(), "new": _Task()}
    far = SchedulerRanks()
    rank = next_use(_Worker(tasks), far)
    # before the scheduler answered: the local readers alone (as a worker without it)
    assert rank("local") == (0, 1, 7, -1) and rank("remote") is None and rank("new") is None
    far.take(["local", "remote", "done"], [(0, 1, 3), (0, 1, 9), None], cost_s=0.001)
    assert rank("local") == (0, 1, 3)       # a reader elsewhere runs sooner than the local one
    assert rank("remote") == (0, 1, 9)      # read by a task not sent here
    assert rank("done") is None             # no reader anywhere: first to leave
    assert rank("new") == SOONEST           # not heard of yet: stays until the next answer
    assert SOONEST < (0, 0, 0)


def test_a_costly_answer_is_asked_for_less_often():
    far = SchedulerRanks()
    assert far.due(now=1e9)
    far.asked_at, far.cost_s = 100.0, 0.1  # 100 ms an answer: at most 5% of the time
    assert not far.due(now=101.0) and far.due(now=102.1)
    # an answer slowed by a busy scheduler (a large graph arriving) leaves ranks at most
    # ASK_MOST_S old, not twenty times its time
    far.asked_at, far.cost_s = 200.0, 1.0
    assert not far.due(now=201.9) and far.due(now=202.0)
    far.answered = False  # a scheduler without the handler is not asked again
    assert not far.due(now=1e9)


def test_the_word_to_write_ahead_waits_for_an_answer_given_since_its_graph_came():
    """The worker's store writes ahead only once the scheduler has said what waits for its
    keys since the graph past its tiers came: the ranks in hand predate that graph, and its
    inputs, held before its tasks came, would rank as needed by no task. A word of 0 ends
    the write-ahead at once."""
    import asyncio

    from spillway.launch.plugins import WorkerSetup

    order = []

    class Far:
        async def ask(self, worker):
            order.append("asked")
            await asyncio.sleep(0.01)
            order.append("answered")

    class Store:
        def write_ahead(self, nbytes):
            order.append(("ahead", nbytes))

    setup = WorkerSetup()
    setup.scheduler_ranks = Far()

    async def main():
        setup._write_ahead(None, Store(), 5)
        assert order == []  # nothing before the answer
        await asyncio.sleep(0.1)
        setup._write_ahead(None, Store(), 0)

    asyncio.run(main())
    assert order == ["asked", "answered", ("ahead", 5), ("ahead", 0)]


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        c.register_plugin(NextUse())
        yield c


def _held(event, _):
    event.wait()
    return 0


async def _asked(dask_worker):
    far = SchedulerRanks()
    await far.ask(dask_worker)
    return far.answered, far.ranks


def test_the_scheduler_says_which_held_keys_a_queued_reader_waits_for(client):
    x = client.persist(da.arange(40, chunks=10))
    wait(x)
    gate = Event()
    # the one thread runs the gate; the readers of chunks 0 and 1 wait behind it
    blocker = client.submit(_held, gate, 0, pure=False)
    chunks = sorted(futures_of(x), key=lambda f: f.key)
    readers = [client.submit(lambda a, _: a.sum(), f, blocker) for f in chunks[:2]]
    address = next(iter(client.scheduler_info()["workers"]))
    # the readers reached the scheduler (submit only sends them)
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) < 7:
        time.sleep(0.01)
    (answered, ranks), = client.run(_asked, workers=[address]).values()
    assert answered
    keys = [(x.name, i) for i in range(4)]
    # tuple keys come back as tuples (the comm's msgpack): chunks 0 and 1 have readers
    assert ranks[keys[0]] is not None and ranks[keys[1]] is not None
    assert ranks[keys[2]] is None and ranks[keys[3]] is None
    gate.set()
    wait(readers)
    (_, ranks), = client.run(_asked, workers=[address]).values()
    assert all(ranks[k] is None for k in keys)  # read: held for the client alone
    on_scheduler = client.run_on_scheduler(lambda dask_scheduler: waiting_for(dask_scheduler, address))
    assert set(map(tuple, on_scheduler["keys"])) >= set(keys)


def test_a_scheduler_without_the_handler_leaves_the_local_ranks():
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as c:
        (answered, ranks), = c.run(_asked).values()
    assert not answered and ranks is None
