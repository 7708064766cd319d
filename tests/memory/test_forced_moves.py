"""The store's moves on a real (in-process) worker running users' rechunks and halos past
its device: what fits on the host is never written to disk, and every answer is dask's."""

from __future__ import annotations

import contextlib

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, wait
from numpy_codec import NumpyCodec

from spillway.launch.plugins import WorkerSetup
from spillway.memory import store as store_module
from spillway.memory.disk import DiskTier
from spillway.memory.store import TieredStore

MB = 2**20


@pytest.fixture(autouse=True)
def small_margin(monkeypatch):
    # the drain's margin at these sizes: 1 MiB (the product's is 2 GiB at least)
    monkeypatch.setattr(store_module, "DRAIN_MIN", MB)


@contextlib.contextmanager
def worker(tmp_path, *, device: int, host: int):
    store = TieredStore(device_limit=device, host_limit=host, codec=NumpyCodec(),
                        below=[DiskTier(str(tmp_path))], drain=True)
    with dask.config.set({"array.rechunk.method": "tasks"}), \
            LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None,
                         data=store) as cluster, Client(cluster) as client:
        client.register_plugin(WorkerSetup(prefetch=False))
        yield client, store
    store.close()


def _field(n: int = 1024, chunks: int = 128) -> tuple:
    values = np.random.default_rng(1).random((n, n))
    return values, da.from_array(values, chunks=(chunks, n))


def _stencil(block):
    out = -4 * block
    out[1:] += block[:-1]
    out[:-1] += block[1:]
    out[:, 1:] += block[:, :-1]
    out[:, :-1] += block[:, 1:]
    return out


def test_a_rechunk_past_the_device_that_fits_the_host_writes_nothing_to_disk(tmp_path):
    values, x = _field()  # 8 MiB in row panels, rechunked to column panels: 16 MiB at once
    with worker(tmp_path, device=4 * MB, host=64 * MB) as (client, store):
        held = client.persist(x)
        wait(held)
        y = client.persist(held.rechunk((1024, 128)))
        wait(y)
        np.testing.assert_array_equal(y.compute(), values)
        stats = store.stats
        assert stats.bytes["device_to_host"] > 0  # it went past the device
        assert stats.bytes["host_to_disk"] == 0 and store.below_bytes == 0, store.summary()
        assert store.peak_bytes >= 16 * MB


def test_halos_past_device_and_host_give_dask_s_answer_and_the_host_keeps_to_its_limit(tmp_path):
    values, x = _field()
    expected = x.map_overlap(_stencil, depth=1, boundary=0).compute(scheduler="sync")
    with worker(tmp_path, device=2 * MB, host=6 * MB) as (client, store):
        held = client.persist(x)
        wait(held)
        y = client.persist(held.map_overlap(_stencil, depth=1, boundary=0))
        wait(y)
        assert store.host_bytes <= 6 * MB + store_module.host_slack(6 * MB)
        assert store.stats.bytes["host_to_disk"] > 0  # 16 MiB for 8 of memory: some went down
        np.testing.assert_array_equal(y.compute(), expected)
        np.testing.assert_array_equal(held.compute(), values)
