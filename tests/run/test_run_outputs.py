"""A run's outputs written, measured and read back (a failed write fails the run with
the path and the OS error, and leaves no store); results come back as host values,
converted on the worker; snapshots leave out workers that are gone."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest

from spillway.options.errors import OutputError
from spillway.run import compute
from spillway.run.host import HOST_TASK, to_host


@pytest.fixture(scope="module")
def inproc_session():
    """A one-worker cluster in this process, so a test can make its writes fail."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
    client = Client(cluster)
    session = types.SimpleNamespace(client=client, kind="cpu", n_workers=1,
                                    plan=types.SimpleNamespace(kind="local", protocol="inproc"))
    try:
        yield session
    finally:
        client.close()
        cluster.close()


def test_output_is_measured_and_read_back(inproc_session, tmp_path):
    out = str(tmp_path / "rows.zarr")
    report = compute.run_workflow(inproc_session, "slice", {"size": [300, 200], "step": 1, "chunks": [100, 100]},
                                 verify=True, output=out)
    on_disk = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs if f != "zarr.json")
    assert report["bytes_written"] == on_disk > 0
    assert report["output_check"]["ok"] is True
    assert report["output_check"]["checksum"] == pytest.approx(report["result"]["checksum"], rel=1e-12)


def test_failed_write_fails_the_run_and_leaves_no_store(inproc_session, tmp_path, monkeypatch):
    import errno

    from zarr.storage import _local

    put = _local._put

    def full_disk(path, value, *args, **kwargs):
        if not str(path).endswith("zarr.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return put(path, value, *args, **kwargs)

    monkeypatch.setattr(_local, "_put", full_disk)
    out = str(tmp_path / "full.zarr")
    with pytest.raises(OutputError) as failed:
        compute.run_workflow(inproc_session, "slice", {"size": [300, 200], "step": 1, "chunks": [100, 100]},
                            verify=True, output=out)
    assert str(failed.value) == (f"output: writing {out} failed: [Errno 28] No space left on device; "
                                 "the partial store was removed")
    assert not os.path.exists(out)


def test_a_store_that_reads_back_other_values_is_not_a_result(inproc_session, tmp_path, monkeypatch):
    from zarr.storage import _local

    put = _local._put
    monkeypatch.setattr(_local, "_put", lambda path, value, *a, **k: None if not str(path).endswith("zarr.json")
                        else put(path, value, *a, **k))  # chunks "written" but nothing stored
    out = str(tmp_path / "lost.zarr")
    with pytest.raises(OutputError, match="reads back a checksum of 0.0, not the result's"):
        compute.run_workflow(inproc_session, "slice", {"size": [300, 200], "step": 1}, output=out)
    assert not os.path.exists(out)


class DeviceStandIn:
    """A device array as the client sees one: it exposes the CUDA array interface and
    copies itself to the host with get()."""

    def __init__(self, data):
        self.data = np.asarray(data)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.data.shape, "typestr": self.data.dtype.str, "version": 3}

    def get(self):
        return self.data.copy()


def test_to_host_converts_device_values_everywhere_in_a_result():
    value = (DeviceStandIn([1.0, 2.0]), [DeviceStandIn(3.0), 4], {"k": DeviceStandIn([5])}, np.float64(6))
    host = to_host(value)
    assert isinstance(host[0], np.ndarray) and host[0].tolist() == [1.0, 2.0]
    assert isinstance(host[1][0], np.ndarray) and host[1][1] == 4
    assert isinstance(host[2]["k"], np.ndarray)
    assert host[3] == 6


def test_gathered_futures_are_host_conversion_tasks(inproc_session, tmp_path, monkeypatch):
    client = inproc_session.client
    gathered = []
    gather = type(client).gather

    def recording(self, futures, *args, **kwargs):
        gathered.extend(futures if isinstance(futures, (list, tuple)) else [futures])
        return gather(self, futures, *args, **kwargs)

    monkeypatch.setattr(type(client), "gather", recording)
    compute.run_workflow(inproc_session, "transpose-sum", {"size": [200, 200]})
    compute.run_workflow(inproc_session, "slice", {"size": [200, 200]}, output=str(tmp_path / "o.zarr"))
    keys = [getattr(f, "key", None) for f in gathered]
    assert keys and all(isinstance(k, str) and k.startswith(HOST_TASK) for k in keys), keys


def test_snapshots_leave_out_workers_that_are_gone():
    calls = []

    class Client:
        def run(self, func, **kwargs):
            calls.append(kwargs)
            return {}

    compute._run_on_workers(Client(), print)
    assert calls == [{"on_error": "ignore"}]
