"""The tiered store on real GPUs (marked gpu; run on the GPU host)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from reference_inputs import uniform_numpy
from spillway.cli import main
from spillway.launch import open_cluster
from spillway.options.settings import Options
from spillway.workflows import random

pytestmark = pytest.mark.gpu

GB = 10**9


def _store_stats(dask_worker):
    return dask_worker.data.summary()


def _allocate_and_sum(*arrays):
    import cupy

    # a temporary larger than what is left in the capped pool: it only fits after the
    # store spills the chunks nobody holds
    big = cupy.ones(3 * 10**9 // 8, dtype=cupy.float64)
    return float(big.sum()) + sum(float(a.sum()) for a in arrays[:0])


def test_task_survives_allocation_failure_through_spill_on_demand(capfd):

    opts = Options.resolve(n_workers=1, rmm_pool_size="1GB", rmm_maximum_pool_size="5GB",
                           device_memory_limit="100GB", dashboard_address="", memory_store="tiered")
    with open_cluster(opts) as session:
        client = session.client
        x = random.uniform((20000, 20000), (5000, 5000), seed=1, backend="cupy")  # 3.2 GB
        x = x.persist()
        client.wait_for_workers(1)
        from distributed import wait

        wait(x)
        f = client.submit(_allocate_and_sum, pure=False)
        assert f.result(timeout=120) == pytest.approx(3 * 10**9 // 8)
        stats = list(client.run(_store_stats).values())[0]
        assert stats["stats"]["ondemand_events"] >= 1, stats
        assert stats["stats"]["bytes"]["device_to_host"] >= 10**9
        # the spilled chunks come back intact
        total = float(x.sum().compute())
        ref = uniform_numpy((20000, 20000), seed=1).sum()
        assert abs(total - ref) / ref < 1e-12
    # the pool's failure before the spill and the retry is no error of the run: RMM's log
    # of it (on the worker's stderr, which the test's descriptors capture) stays out
    err = capfd.readouterr().err
    assert "maximum pool size exceeded" not in err.lower(), err[-2000:]


@pytest.mark.parametrize("memory_limit, expect_disk", [("auto", False), ("1GB", True)])
def test_persisted_input_larger_than_device_limit_gives_reference(memory_limit, expect_disk, tmp_path):
    """B2 at small scale: 3.2 GB persisted under a 1 GB device limit per GPU, then
    (x + x.T).sum(); with a 1 GB host limit the rest goes to disk."""
    from distributed import wait

    from spillway.launch.plugins import worker_snapshot
    from spillway.run.stats import transfer_stats

    opts = Options.resolve(device_memory_limit="1GB", memory_limit=memory_limit, rmm_pool_size="4GB",
                           local_directory=str(tmp_path), dashboard_address="", memory_store="tiered")
    with open_cluster(opts) as session:
        client = session.client
        x = random.uniform((20000, 20000), (2500, 2500), seed=3, backend="cupy").persist()
        wait(x)
        before = client.run(worker_snapshot)
        import time

        start = time.time()
        total = float((x + x.T).sum().compute())
        after = client.run(worker_snapshot)
        stats = transfer_stats(before, after, start_wall=start)
        print(json.dumps({"wall_s": time.time() - start, "spill": stats["spill"]}, indent=1))
        resident = [snap["store"] for snap in after.values()]
        assert all(r["device_bytes"] <= 1 * GB + 50 * 10**6 for r in resident), resident
        ref = 2 * uniform_numpy((20000, 20000), seed=3).sum()
        assert abs(total - ref) / ref < 1e-12
        moves = [w["moves"] for w in stats["spill"].values()]
        assert sum(m["host_to_device"]["bytes"] for m in moves) > 0
        spilled = sum(snap["spilled"]["device_to_host"] for snap in after.values())
        assert spilled >= 3.2e9 - 2 * GB
        if expect_disk:
            assert sum(snap["spilled"]["host_to_disk"] for snap in after.values()) > 0
            assert sum(m["disk_to_host"]["bytes"] for m in moves) > 0


def test_admission_refuses_what_fits_nowhere():
    result = CliRunner().invoke(
        main,
        ["run", "transpose-sum", "--param", "size=2000000x2000000", "--device-memory-limit", "1GB",
         "--memory-limit", "1GB", "--dashboard-address", ""],
    )
    assert result.exit_code == 3, result.output
    assert "exceeds the cluster's device + host + disk capacity" in result.output


def _qr_parts(block):
    import cupy

    q, r = cupy.linalg.qr(block)
    return (q, r)


def _allocate(nbytes):
    import cupy

    return float(cupy.ones(nbytes // 8, dtype=cupy.float64).sum())


def test_persisted_views_and_tuples_make_room_and_exhaustion_is_one_line():
    """Persisted values that view larger allocations, and tuples whose arrays other keys
    store too, leave the device for a task that needs room; a task asking for more than
    the pool can ever give fails with the store's line, and the worker lives on."""
    from distributed import wait

    from spillway.options.errors import DeviceMemoryExhausted

    opts = Options.resolve(n_workers=1, rmm_pool_size="1GB", rmm_maximum_pool_size="5GB",
                           device_memory_limit="100GB", dashboard_address="", memory_store="tiered")
    with open_cluster(opts) as session:
        client = session.client
        x = random.uniform((20000, 20000), (5000, 5000), seed=5, backend="cupy")
        halves = x.map_blocks(lambda b: b[:, :2500], chunks=(5000, 2500)).persist()  # views
        blocks = client.compute(x.to_delayed().ravel().tolist())
        pairs = [client.submit(_qr_parts, b) for b in blocks[:4]]
        qs = [client.submit(lambda p: p[0], p) for p in pairs]
        wait([halves, *pairs, *qs])
        del blocks
        f = client.submit(_allocate, 3 * 10**9, pure=False)
        assert f.result(timeout=120) == pytest.approx(3 * 10**9 // 8)
        stats = list(client.run(_store_stats).values())[0]
        assert stats["stats"]["ondemand_events"] >= 1 and stats["stats"]["ondemand_bytes"] >= 10**9, stats
        with pytest.raises(DeviceMemoryExhausted) as info:
            client.submit(_allocate, 10 * 10**9, pure=False).result(timeout=120)
        message = str(info.value)
        assert "cannot allocate 9.31 GiB on the device" in message and "disk" in message, message
        assert client.run(lambda: 1)  # the worker survived
        ref = uniform_numpy((20000, 20000), seed=5)
        total = float(halves.sum().compute())
        expected = sum(ref[i:i + 5000, j:j + 2500].sum() for i in range(0, 20000, 5000)
                       for j in range(0, 20000, 5000))
        assert abs(total - expected) / abs(expected) < 1e-12
        q0 = client.gather(qs[0])
        assert abs(float(abs(q0).sum()) - float(abs(client.gather(pairs[0])[0]).sum())) == 0


@pytest.mark.parametrize("limit", ["device_memory_limit", "memory_limit"])
def test_a_limit_of_zero_starts_a_real_worker_with_no_limit(limit, tmp_path):
    """0 is "no limit" from the options to the store: the worker starts (it used to die
    building its store on int(math.inf)), admission reads the hardware, and a run is
    NumPy's answer."""
    from spillway.run.compute import run_workflow

    opts = Options.resolve(**{limit: 0}, rmm_pool_size="4GB", local_directory=str(tmp_path),
                           dashboard_address="", memory_store="tiered")
    with open_cluster(opts) as session:
        stores = list(session.client.run(_store_stats).values())
        limits = session.client.run(lambda dask_worker: (dask_worker.data.device_limit, dask_worker.data.host_limit))
        device, host = list(limits.values())[0]
        if limit == "device_memory_limit":
            assert device is None and host > 0
        else:
            assert host is None and device > 0
        assert stores[0]["books"]["available_bytes"] > 0
        report = run_workflow(session, "transpose-sum", {"size": "2GB"}, verify=True)
        assert report["verify"]["ok"], report["verify"]
        capacity = report["admission"]["capacity"]
        assert capacity["device_bytes"] > 10 * GB and capacity["host_bytes"] > GB, capacity


def test_pageable_buffers_go_through_the_staging_ring_both_ways_and_pinned_ones_do_not():
    import cupy
    import cupyx

    from spillway.memory.codecs import CupyCodec
    from spillway.memory.staging import SLOT_BYTES

    codec = CupyCodec()
    nbytes = 3 * SLOT_BYTES + 12345  # several slots and a part of one
    value = cupy.random.default_rng(3).integers(0, 256, nbytes, dtype=cupy.uint8)
    pageable = codec.to_host(value.data.ptr, nbytes, lambda n: np.empty(n, dtype=np.uint8))
    assert codec._staged(pageable, nbytes) and "_down" in codec.__dict__
    np.testing.assert_array_equal(pageable, value.get())
    back = codec.to_device(pageable)
    assert "_up" in codec.__dict__ and bool((back == value).all())
    pinned = cupyx.empty_pinned(nbytes, dtype=np.uint8)
    assert not codec._staged(pinned, nbytes)
    np.testing.assert_array_equal(codec.to_host(value.data.ptr, nbytes, lambda n: pinned), value.get())
