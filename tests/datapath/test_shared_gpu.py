"""Two workers on one GPU (``workers-per-gpu 2``), on a ONE-GPU host: each worker its own
process with its share of the GPU, chunks moved between them over UCXX (CUDA IPC within
the device), values arriving bit for bit, and spilling per worker. Marked gpu: skipped
where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from spillway.launch import open_cluster
from spillway.launch.plan import ucxx_installed
from spillway.options.settings import Options
from spillway.datapath.transfer import IPC_SAME_GPU, TCP_SAME_GPU

pytestmark = pytest.mark.gpu

needs_ucxx = pytest.mark.skipif(not ucxx_installed(), reason="distributed-ucxx is not installed")
#: pinned arena of each worker: small, so the clusters start and close quickly (``auto``
#: pins a quarter of the host per worker here, at about 2.3 GB/s)
PINNED = "2GB"


def _identity(dask_worker):
    import os

    import cupy

    from spillway.memory.store import TieredStore

    data = dask_worker.data
    return {
        "pid": os.getpid(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "bus": cupy.cuda.Device(0).pci_bus_id.lower(),
        "device_limit": data.device_limit if isinstance(data, TieredStore) else None,
        "name": dask_worker.name,
    }


@needs_ucxx
def test_two_workers_share_one_gpu_and_move_chunks_over_cuda_ipc():
    from spillway_bench.transfers import moves

    options = Options.resolve(devices="0", workers_per_gpu=2, protocol="ucx", pinned_pool_size=PINNED,
                              dashboard_address=None)
    with open_cluster(options) as session:
        assert session.n_workers == 2 and session.plan.devices == (0, 0)
        assert session.scheduler_address.startswith("ucx://")
        workers = sorted(session.client.run(_identity).values(), key=lambda w: str(w["name"]))
        assert len({w["pid"] for w in workers}) == 2
        assert {w["visible"].split(",")[0] for w in workers} == {"0"}
        assert len({w["bus"] for w in workers}) == 1
        assert [w["name"] for w in workers] == ["0-0", "0-1"]
        gpu = session.plan.device_memory[0] * 2
        for w in workers:  # each holds its share: 80% of half the GPU
            assert w["device_limit"] == int(0.8 * (gpu // 2))
        from spillway.datapath.transfer import transport

        assert transport(session.client) == IPC_SAME_GPU
        moved = moves(session.client, [16 * 2**20, 256 * 2**20], repeats=3)
        for m in moved:
            assert m["same_bits"], m
        # within the GPU's memory: faster than any path through the host could carry it
        # (pinned copies run at about 54 GB/s each way on the H100 host)
        assert moved[-1]["gbps_median"] > 27, moved


def test_without_ucx_the_workers_of_one_gpu_talk_tcp_and_say_so():
    options = Options.resolve(devices="0", workers_per_gpu=2, protocol="tcp", pinned_pool_size=PINNED,
                              dashboard_address=None)
    with open_cluster(options) as session:
        from spillway_bench.transfers import moves
        from spillway.datapath.transfer import transport

        assert transport(session.client) == TCP_SAME_GPU
        (m,) = moves(session.client, [16 * 2**20], repeats=1)
        assert m["same_bits"]


def _store_tiers(dask_worker):
    from spillway.memory.store import TieredStore

    data = dask_worker.data
    assert isinstance(data, TieredStore)
    summary = data.summary()
    return {"device": summary["device_bytes"], "host": summary["host_bytes"], "limit": data.device_limit}


@needs_ucxx
def test_each_worker_of_a_shared_gpu_spills_past_its_own_share():
    """With a 1 GB device limit each, an input of 6 GB over the two workers of one GPU
    spills on both; its sum is NumPy's float64 sum of the same chunks."""
    import cupy
    import dask.array as da
    from distributed import wait

    from placement_checks import bytes_per_worker

    options = Options.resolve(devices="0", workers_per_gpu=2, protocol="ucx", device_memory_limit="1GB",
                              rmm_pool_size="4GB", pinned_pool_size=PINNED, dashboard_address=None)
    n, chunk = 27386, 4096  # 27386^2 float64: 6.0 GB in 7 row panels of 0.9 GB
    with open_cluster(options) as session:
        client = session.client
        x = da.random.default_rng(cupy.random.default_rng(7)).random((n, n), chunks=(chunk, n)).persist()
        wait(x)
        held = bytes_per_worker(client, x)
        assert len(held) == 2 and all(v > 1e9 for v in held.values()), held
        for addr, tiers in client.run(_store_tiers).items():
            assert tiers["device"] <= tiers["limit"] and tiers["host"] > 0, (addr, tiers)
        total = float(x.sum().compute())
        # NumPy's float64 sum of the same panels, brought to the host one at a time
        expected = sum(float(np.sum(cupy.asnumpy(client.compute(x[i:i + chunk]).result()), dtype=np.float64))
                       for i in range(0, n, chunk))
        assert abs(total - expected) / abs(expected) < 1e-12
        del x


def test_spillway_local_takes_workers_per_gpu():
    import spillway

    with spillway.local(devices="0", workers_per_gpu=2, pinned_pool_size=PINNED, dashboard_address=None) as cluster:
        assert cluster.kind == "gpu" and cluster.n_workers == 2
        report = cluster.run("transpose-sum", {"size": "8000x8000"}, chunks="2000x2000", seed=5, verify=True,
                             progress=False)
        assert report["cluster"]["n_workers"] == 2 and report["verify"]["ok"] is True
        assert report["bytes_transferred"] > 0  # mirrored chunks crossed between the two workers
        if ucxx_installed():
            assert report["transport"] == IPC_SAME_GPU, report["transport"]
