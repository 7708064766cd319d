"""The meetings of a put kind's steps on the scheduler (:meth:`StepCoordinator.meet`): each
step gets every peer's places once all have posted; a ``done`` meeting of an attempt that
ended answers only once every step that may still write into its peers' outputs said it is
done or left; a step whose kernel failed loses the exchange for every step, in one line.
On a real scheduler with real workers (their leaving is what ends an attempt)."""

from __future__ import annotations

import asyncio

import pytest

distributed = pytest.importorskip("distributed")

import contextlib  # noqa: E402

from distributed import Scheduler, Worker  # noqa: E402

from spillway.datapath.step.coordinator import StepCoordinator, _Exchange  # noqa: E402
from spillway.datapath.step.state import ABORT, DROP  # noqa: E402

NAME = "spillway-step-meetings"
OFFERS = {"ipc": "one-host/boot", "host": "127.0.0.1:1"}


async def _joined(s, workers) -> tuple[StepCoordinator, int]:
    """A coordinator on ``s`` and an exchange of a step a worker, every step joined."""
    for w in workers:  # what a worker's first step adds: the scheduler tells joined workers
        w.stream_handlers.update({ABORT: lambda **_: None, DROP: lambda **_: None})
    coordinator = StepCoordinator()
    s.add_plugin(coordinator)
    await coordinator.start(s)
    coordinator._exchanges[NAME] = _Exchange(NAME, len(workers), next(coordinator._numbers))
    answers = await asyncio.gather(*(coordinator.join(name=NAME, slot=i, worker=w.address, offers=OFFERS)
                                     for i, w in enumerate(workers)))
    assert {a["kind"] for a in answers} == {"ipc"}
    return coordinator, answers[0]["attempt"]


def on_cluster(workers: int):
    """The test, a coroutine of ``(s, *workers)``, run on a scheduler and ``workers``
    workers of this process, over TCP on loopback, bounded in time."""
    def wrap(test):
        def run():
            async def main():
                async with contextlib.AsyncExitStack() as stack:
                    s = await stack.enter_async_context(Scheduler(host="127.0.0.1", port=0, dashboard_address=None))
                    ws = [await stack.enter_async_context(Worker(s.address, nthreads=1, host="127.0.0.1"))
                          for _ in range(workers)]
                    await asyncio.wait_for(test(s, *ws), 60)

            asyncio.run(main())

        # not functools.wraps: pytest would read the test's own arguments as fixtures
        run.__name__, run.__doc__ = test.__name__, test.__doc__
        return run

    return wrap


def _meet(coordinator, attempt, slot, stage, payload=None):
    return asyncio.ensure_future(coordinator.meet(name=NAME, slot=slot, attempt=attempt, stage=stage, round=0,
                                                  payload=payload))


@on_cluster(3)
async def test_each_step_gets_every_peer_s_places_once_all_posted(s, *workers):
    coordinator, attempt = await _joined(s, workers)
    first = [_meet(coordinator, attempt, i, "places", {"at": i}) for i in range(2)]
    await asyncio.sleep(0.1)
    assert not any(f.done() for f in first)  # the third has not posted
    last = _meet(coordinator, attempt, 2, "places", {"at": 2})
    answers = await asyncio.gather(*first, last)
    assert all(a == {"payloads": {0: {"at": 0}, 1: {"at": 1}, 2: {"at": 2}}} for a in answers)
    done = await asyncio.gather(*(_meet(coordinator, attempt, i, "done", {"failed": None}) for i in range(3)))
    assert all(set(a["payloads"]) == {0, 1, 2} for a in done)


@on_cluster(3)
async def test_an_ended_attempt_s_done_meeting_waits_for_every_writer(s, *workers):
    coordinator, attempt = await _joined(s, workers)
    await asyncio.gather(*(_meet(coordinator, attempt, i, "places", {}) for i in range(3)))
    # every step has its peers' places: each may be writing into the others' outputs
    zero = _meet(coordinator, attempt, 0, "done", {"failed": None})
    await asyncio.sleep(0.05)
    coordinator._restart(coordinator._exchanges[NAME], "a test ends the attempt")
    one = _meet(coordinator, attempt, 1, "done", {"failed": None})
    await asyncio.sleep(0.2)
    # slot 2 may still be writing into slot 0's and 1's outputs: neither may free them
    assert not zero.done() and not one.done()
    await workers[2].close()  # a writer that left writes no more
    answers = await asyncio.wait_for(asyncio.gather(zero, one), 10)
    assert answers == [{"restart": True}, {"restart": True}]
    # a step that comes late to an ended attempt's places is told at once
    late = await asyncio.wait_for(_meet(coordinator, attempt, 2, "places", {}), 5)
    assert late == {"restart": True}


@on_cluster(2)
async def test_a_failed_kernel_loses_the_exchange_for_every_step_in_one_line(s, *workers):
    coordinator, attempt = await _joined(s, workers)
    await asyncio.gather(*(_meet(coordinator, attempt, i, "places", {}) for i in range(2)))
    answers = await asyncio.gather(_meet(coordinator, attempt, 0, "done", {"failed": None}),
                                   _meet(coordinator, attempt, 1, "done", {"failed": "CUDARuntimeError: boom"}))
    assert all("lost" in a for a in answers)
    line = answers[0]["lost"]
    assert "\n" not in line and "step 1 on" in line and "CUDARuntimeError: boom" in line
