"""The collective rechunk between GPU workers: CuPy pieces cut on the device, taken over
the data plane (device to device), assembled on the device; bit for bit equal to dask's
task-based rechunk, a task a chunk, no piece left behind, the bytes in the workers'
incoming logs, and users' own ``x.rechunk`` and ``da.fft`` routed to it."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _left(dask_worker=None):
    return sum(1 for k in dask_worker.data if type(k) is tuple and str(k[0]).startswith("spillway-pieces-"))


def _incoming(dask_worker=None):
    return sum(e["total"] for e in dask_worker.transfer_incoming_log)


@pytest.mark.parametrize("layout", ["two GPUs", "one GPU, two workers"])
def test_a_panel_rechunk_moves_device_pieces_and_equals_the_tasks_method(gpu_count, layout):
    if layout == "two GPUs" and gpu_count < 2:
        pytest.skip("needs two GPUs")
    import cupy
    import dask.array as da

    import spillway
    from spillway.datapath.collective import rechunk
    from spillway.datapath.plane import counters

    changes = {"devices": "0,1"} if layout == "two GPUs" else {"devices": "0", "workers_per_gpu": 2}
    # the pieces' tasks, which these checks look into (the steps: test_step_gpu.py)
    with spillway.local(protocol="ucx", rmm_pool_size="16GB", dashboard_address="", exchange="pieces", **changes) as lc:
        client = lc.client
        x = da.random.default_rng(7).random((12000, 9000), chunks=(1000, 9000)).map_blocks(cupy.asarray)
        x = x.persist()
        before = client.run(_incoming)
        planes_before = client.run(counters)
        lazy = rechunk(x, (12000, 700))
        # a task a chunk in and out, a barrier: not a task a piece
        layers = {name: len(layer) for name, layer in lazy.dask.layers.items() if "spillway-cut" in name
                  or "rechunk-exchange" in name or "spillway-barrier" in name}
        assert sum(layers.values()) == 12 + 13 + 1, layers
        y = lazy.persist()
        got = cupy.asnumpy(y.compute())
        want = cupy.asnumpy(x.rechunk((12000, 700), method="tasks").compute())
        assert np.array_equal(got, want)
        assert isinstance(y._meta, cupy.ndarray) or type(y._meta).__module__.startswith("cupy")
        after = client.run(_incoming)
        moved = sum(after.values()) - sum(before.values())
        # about half the pieces cross between the two workers (each holds half the panels)
        assert moved >= 0.3 * x.nbytes, (moved, x.nbytes)
        planes_after = client.run(counters)
        fetched = sum((planes_after[w] or {}).get("fetched", 0) - (planes_before[w] or {}).get("fetched", 0)
                      for w in planes_after)
        assert fetched > 0, planes_after
        del y, lazy
        assert sum(client.run(_left).values()) == 0

        # users' code: dask picks its p2p path, which is the collective on this cluster
        z = x.rechunk((12000, 500))
        assert any(name.startswith("spillway-cut-") for name in z.dask.layers)
        assert np.array_equal(cupy.asnumpy(z.compute()), want)
        f = da.fft.fft(x.rechunk({0: -1, 1: 1000}), axis=0)
        ref = np.fft.fft(want[:, :1000], axis=0)
        got_f = cupy.asnumpy(f[:, :1000].compute())
        assert np.abs(got_f - ref).max() / np.abs(ref).max() < 1e-12
