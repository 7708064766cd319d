"""Fixtures the collective's CPU tests share."""

from __future__ import annotations

import pytest


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
