"""The cluster's worker count is asked of the scheduler, not read back from the client's
cached identity: the client's periodic refresh of that cache asks for no workers, and an
answer of it landing between a fresh fetch and its read made a cluster of two workers
read none (a compute then refused with "this cluster has none"; seen on a loaded
machine). The refresh runs every 5 ms here, so that reading the cache would read short
many times in the reads below."""

from __future__ import annotations

from types import SimpleNamespace

import dask
from distributed import Client, LocalCluster

from spillway.launch import scheduler_workers
from spillway.clusters.base import Cluster

READS = 1000


def test_the_worker_count_reads_every_worker_while_the_client_refreshes_its_cache():
    with dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}), \
            LocalCluster(n_workers=2, processes=False, threads_per_worker=1, dashboard_address=None) as lc, \
            Client(lc) as client:
        cluster = SimpleNamespace(client=client)
        counts = [Cluster.n_workers.fget(cluster) for _ in range(READS)]
        names = [Cluster._worker_names(cluster) for _ in range(READS // 10)]
        addresses = [sorted(scheduler_workers(client)) for _ in range(READS // 10)]
    assert counts.count(2) == READS, f"read short {READS - counts.count(2)} of {READS} times"
    assert all(n == {0, 1} for n in names), [n for n in names if n != {0, 1}][:3]
    assert all(len(a) == 2 for a in addresses)
