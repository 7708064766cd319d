"""A worker lost mid-exchange: the exchange's steps run again and the answer is right, or,
past the restarts allowed, the computation fails in one line; within 60 s either way, and
the survivors' steps are not left waiting."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")


def _slow_first(block, block_info=None):
    # the first input chunk comes late: every other step has joined and waits for it
    if block_info[None]["chunk-location"][0] == 0:
        time.sleep(3.0)
    return block


@pytest.fixture
def cluster():
    import dask
    from distributed import Client, LocalCluster

    from spillway.datapath.collective import CollectivePlacement, use_on
    from spillway.datapath.collective.method import stop_using
    from spillway.datapath.step.coordinator import StepCoordinator

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1", protocol="tcp",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(StepCoordinator())
        client.register_plugin(CollectivePlacement())
        use_on(client)
        try:
            with dask.config.set({"array.rechunk.method": "p2p"}):
                yield client
        finally:
            stop_using(client)


def _exchange(client):
    import dask.array as da

    a = np.random.default_rng(11).standard_normal((120, 90))
    x = da.from_array(a, chunks=(10, 90)).map_blocks(_slow_first, dtype=a.dtype)
    y = x.rechunk((120, 9))
    assert any(name.startswith("spillway-step-") for name in y.dask.layers)
    return a, y


def _kill_a_waiting_step(client, future) -> str:
    """Kills the worker of a step that has joined and waits (not the slow one's)."""
    def placed(dask_scheduler=None):
        return {str(k): sorted(ts.worker_restrictions or ()) for k, ts in dask_scheduler.tasks.items()
                if "spillway-step-" in str(k)}

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        steps = client.run_on_scheduler(placed)
        if len(steps) == 3 and all(steps.values()):
            break
        time.sleep(0.1)
    time.sleep(1.0)  # the fast steps join and wait for the slow one
    victim = sorted(steps.items())[-1][1][0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    return victim


def test_a_worker_lost_mid_exchange_runs_the_exchange_again_and_answers_right(cluster):
    a, y = _exchange(cluster)
    began = time.monotonic()
    future = cluster.compute(y)
    _kill_a_waiting_step(cluster, future)
    got = future.result(timeout=60)
    assert time.monotonic() - began < 60
    assert np.array_equal(got, a)


def test_past_its_restarts_an_exchange_fails_in_one_line_within_60_s(cluster, monkeypatch):
    from spillway.datapath.step import coordinator

    monkeypatch.setattr(coordinator, "RESTARTS", 0)
    a, y = _exchange(cluster)
    began = time.monotonic()
    future = cluster.compute(y)
    victim = _kill_a_waiting_step(cluster, future)
    with pytest.raises(Exception) as raised:
        future.result(timeout=60)
    assert time.monotonic() - began < 60
    line = str(raised.value)
    assert "\n" not in line.strip()
    assert f"worker {victim} left" in line and "cannot finish" in line
