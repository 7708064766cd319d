"""The client receives a value from every worker before a GPU cluster is handed out
(:func:`spillway.launch.session.send_to_client`)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, get_worker

from spillway.launch import session

pytestmark = pytest.mark.timeout(120)


def _made_here(nbytes):
    worker = get_worker()
    worker.made = getattr(worker, "made", 0) + 1
    return np.zeros(nbytes, dtype=np.uint8)


def _broken(nbytes):
    raise RuntimeError("no device here")


def test_each_worker_sends_the_client_one_value_and_keeps_none():
    with LocalCluster(n_workers=3, processes=False, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = sorted(cluster.scheduler.workers)
        session.received(client, session.send_to_client(client, workers, _made_here, nbytes=1024))
        assert client.run(lambda dask_worker: getattr(dask_worker, "made", 0)) == dict.fromkeys(workers, 1)
        # nothing of the warm-up stays held on the cluster
        deadline = time.monotonic() + 10
        while cluster.scheduler.tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not cluster.scheduler.tasks


def test_a_warm_up_that_fails_is_a_debug_line(caplog):
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client, caplog.at_level(logging.DEBUG, logger=session.logger.name):
        session.received(client, session.send_to_client(client, sorted(cluster.scheduler.workers), _broken))
    assert "the results path was not warmed: RuntimeError: no device here" in caplog.text
