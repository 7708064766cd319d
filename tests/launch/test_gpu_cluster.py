"""GPU cluster behaviour; runs on the GPU host (marked gpu, skipped elsewhere)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spillway.cli import main
from spillway.options.gpus import discover
from spillway.launch import open_cluster
from spillway.launch.plan import ucxx_installed
from spillway.options.settings import Options

pytestmark = pytest.mark.gpu


def _device_identity(dask_worker):
    import os

    import cupy
    import rmm

    from spillway.launch.plugins import PLUGIN_NAME

    resources = []
    mr = rmm.mr.get_current_device_resource()
    while mr is not None:
        resources.append(type(mr).__name__)
        mr = mr.get_upstream() if hasattr(mr, "get_upstream") else None
    return {
        "visible": os.environ["CUDA_VISIBLE_DEVICES"],
        "bus": cupy.cuda.Device(0).pci_bus_id.lower(),
        "resources": resources,
        "kind": dask_worker.plugins[PLUGIN_NAME].kind,
        "cupy_allocator": cupy.cuda.get_allocator().__name__ if hasattr(cupy.cuda.get_allocator(), "__name__") else str(cupy.cuda.get_allocator()),
    }


def _by_device(session):
    info = session.client.run(_device_identity)
    return sorted(info.values(), key=lambda v: int(v["visible"].split(",")[0]))


def test_one_worker_per_gpu_and_device_mapping():
    inventory = discover()
    with open_cluster(Options.resolve(rmm_pool_size="2GB", dashboard_address="")) as session:
        assert session.kind == "gpu"
        assert session.n_workers == len(inventory)
        workers = _by_device(session)
        for i, w in enumerate(workers):
            assert int(w["visible"].split(",")[0]) == i
            assert w["bus"][-12:] == inventory.gpus[i].pci_bus_id[-12:], (w, inventory.gpus[i])
            assert w["kind"] == "gpu"
            assert "PoolMemoryResource" in w["resources"], w["resources"]
            assert w["resources"][0] == "StatisticsResourceAdaptor"
            assert "rmm" in w["cupy_allocator"], w  # RMM's allocator, or the store's wrapper of it
        if len(inventory) > 1 and ucxx_installed():
            assert session.scheduler_address.startswith("ucx://")
            assert session.plan.protocol == "ucx"


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"rmm_async": True}, "CudaAsyncMemoryResource"),
        ({"rmm_managed_memory": True, "nvlink": False, "protocol": "tcp"}, "ManagedMemoryResource"),
        ({"rmm_pool_size": "1GB", "rmm_maximum_pool_size": "4GB"}, "PoolMemoryResource"),
    ],
)
def test_worker_rmm_resource_matches_options(kwargs, expected):
    with open_cluster(Options.resolve(dashboard_address="", n_workers=1, **kwargs)) as session:
        (w,) = _by_device(session)
        assert expected in w["resources"], w["resources"]
        if "rmm_managed_memory" in kwargs:
            # allocate well under free memory: managed memory must never be oversubscribed here
            nbytes = session.client.run(_managed_roundtrip)
            assert list(nbytes.values()) == [256 * 2**20]


def _managed_roundtrip():
    import cupy

    a = cupy.ones(32 * 2**20, dtype=cupy.float64)
    return int(a.sum().item()) * 8


def test_run_transpose_sum_on_gpus_matches_reference():
    result = CliRunner().invoke(
        main,
        ["run", "transpose-sum", "--json", "--verify", "--param", "size=20000x20000",
         "--param", "chunks=5000x5000", "--rmm-pool-size", "8GB", "--dashboard-address", ""],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report["cluster"]["kind"] == "gpu"
    assert report["verify"]["ok"], report["verify"]
    assert report["memory_measure"] == "rmm"
    chunk = 5000 * 5000 * 8
    assert all(v >= chunk for v in report["peak_bytes_per_worker"].values())
    if report["cluster"]["n_workers"] > 1:
        assert report["bytes_transferred"] > 0
