"""spillway's errors keep their type on the way from a worker to the client."""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster

from spillway.options.errors import DeviceMemoryExhausted, SpillwayError


def _exhausted():
    raise DeviceMemoryExhausted("worker 0 (tcp://127.0.0.1:1): cannot allocate 496.00 MiB on the device") \
        from MemoryError("RMM failure: maximum pool size exceeded")


@pytest.mark.timeout(120)
def test_device_memory_exhausted_reaches_the_client_as_itself():
    with LocalCluster(n_workers=1, processes=True, threads_per_worker=1, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        future = client.submit(_exhausted, pure=False)
        with pytest.raises(DeviceMemoryExhausted) as info:
            future.result()
    assert isinstance(info.value, MemoryError) and isinstance(info.value, SpillwayError)
    assert str(info.value).startswith("worker 0 (tcp://127.0.0.1:1): cannot allocate 496.00 MiB")
