"""The collective over the data plane between real workers (UCXX over UCX's TCP transport
here, CUDA IPC between GPUs on the GPU hosts): pieces taken in one plane request per
holder, the values bit for bit those of dask's task-based rechunk, nothing left behind."""

from __future__ import annotations

import time

import dask.array as da
import numpy as np
import pytest

from spillway.datapath.plane import hook


@pytest.fixture(scope="module")
def ucx_client():
    from ucx_workers import ucx_workers

    from spillway.datapath.collective import CollectivePlacement
    from spillway.datapath.plane import DataPlanePlugin

    with ucx_workers(DataPlanePlugin(), CollectivePlacement()) as client:
        yield client


def _pieces_left(dask_worker=None) -> int:
    return sum(1 for k in dask_worker.data if type(k) is tuple and str(k[0]).startswith("spillway-pieces-"))


@pytest.mark.parametrize("fit", [0.25, 0.0], ids=["grouped", "pieces"])
@pytest.mark.parametrize("new", [(600, 40), (70, 90), ((100, 500), (250, 350))])
def test_pieces_cross_the_plane_and_the_values_hold(ucx_client, new, fit):
    from spillway.datapath.collective import PLUGIN_NAME, CollectivePlacement, rechunk

    client = ucx_client
    client.unregister_scheduler_plugin(PLUGIN_NAME)
    client.register_plugin(CollectivePlacement(fit_fraction=fit))
    # an array of its own for each mode: the exchange is another one, not the last
    # test's made again under a plugin swapped in between
    x = da.random.default_rng(4 if fit else 5).random((600, 600), chunks=(50, 600)).persist()
    want = x.rechunk(new, method="tasks").compute()
    before = client.run(hook.counters)
    got = client.compute(rechunk(x, new)).result(timeout=120)
    assert np.array_equal(got, want)
    after = client.run(hook.counters)
    # the workers that answered both times (on a loaded machine a worker's stream to the
    # scheduler can break and the worker register again, missing from one of the two)
    both = [w for w in after if w in before]
    fetched = sum(after[w]["fetched"] - before[w]["fetched"] for w in both)
    assert fetched > 0  # the pieces went over the plane, one request per holder and output
    assert all(after[w]["lost"] == before[w]["lost"] for w in both)
    deadline = time.monotonic() + 10
    while sum(client.run(_pieces_left).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(client.run(_pieces_left).values()) == 0
