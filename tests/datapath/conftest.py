"""Fixtures the collective's CPU tests share."""

from __future__ import annotations

import pytest
from stand_ins import OtherSession


@pytest.fixture(scope="module")
def collective_client():
    """A client of three local worker processes over TCP, with the collective's scheduler
    plugin: one cluster a test module."""
    from distributed import Client, LocalCluster

    from spillway.datapath.collective import CollectivePlacement

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1", protocol="tcp",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        c.register_plugin(CollectivePlacement())
        yield c


@pytest.fixture
def routed(monkeypatch):
    """dask's P2P rechunk and overlap_internal routed to the collective, as while a
    spillway cluster's client is the default; rechunks take P2P whatever their size. Built
    on dask's local scheduler: no cluster to ask for room."""
    import dask

    from spillway.datapath.collective import graph, method

    session = OtherSession("tcp://spillway-routed.invalid:1")
    method.use_on(session)
    monkeypatch.setattr(method, "_on_spillway", lambda: True)
    monkeypatch.setattr(graph, "cluster_room", lambda: None)
    # no cluster: one step does it all (the option's way), whatever client an earlier test
    # left as the default in this process
    monkeypatch.setattr(graph, "step_slots",
                        lambda room: 1 if dask.config.get("spillway.exchange", "step") == "step" else 0)
    try:
        with dask.config.set({"array.rechunk.method": "p2p"}):
            yield
    finally:
        method.stop_using(session)
