"""`spillway.local()` holds user code to the tiers: a persist or compute past what the
workers hold (memory and spill disk) is refused before it runs, through the plain Dask
client the session hands out, and the session goes on."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import futures_of, get_task_stream, wait

import spillway
from spillway import AdmissionError


@pytest.fixture(scope="module")
def cluster():
    with spillway.local(cpu=True, n_workers=1, dashboard_address=None) as lc:
        yield lc


def test_a_persist_past_the_tiers_is_refused_at_once_and_the_session_goes_on(cluster):
    client = cluster.client
    x = client.persist(da.arange(10_000, chunks=1000))
    huge = da.ones((10**7, 10**6), chunks=(10**4, 10**6))  # 80 TB of ones
    with get_task_stream(client) as stream:
        y = huge.persist()  # as users write it: dask's persist on the session's client
        futures = futures_of(y)
        wait(futures)
        assert {f.status for f in futures} == {"error"}
        with pytest.raises(AdmissionError, match=r"^persist refused before it ran: its 1000 new outputs \(72\.76 TiB"):
            futures[0].result()
        with pytest.raises(AdmissionError, match=r"^persist refused before it ran"):
            y.sum().compute()  # what is built on it says the same
    # refused at once: not one of its tasks ran
    assert not [t for t in stream.data if huge.name in str(t["key"])]
    with pytest.raises(AdmissionError, match="^compute refused before it ran"):
        cluster.compute(huge + 1, progress=False)
    with pytest.raises(AdmissionError, match="^compute refused before it ran"):
        dask.compute(huge.T)
    assert int(cluster.compute(x.sum(), progress=False)) == int(np.arange(10_000).sum())


def test_a_plain_client_attached_to_the_session_s_scheduler_is_held_to_the_tiers_too(cluster):
    from distributed import Client

    with Client(cluster.session.scheduler_address) as other:
        y = other.persist(da.ones((10**7, 10**6), chunks=(10**4, 10**6)))
        futures = futures_of(y)
        wait(futures)
        with pytest.raises(AdmissionError, match="^persist refused before it ran"):
            futures[0].result()
        assert float(other.compute(da.ones(10, chunks=5).sum()).result()) == 10.0
