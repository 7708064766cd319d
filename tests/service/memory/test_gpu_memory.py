"""The tiered store on real GPUs (marked gpu; run on the GPU host)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from service.cli import main
from service.launch import open_cluster
from service.options import Options
from workflows import random

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


def test_task_survives_allocation_failure_through_spill_on_demand():
    import dask.array as da

    opts = Options.resolve(n_workers=1, rmm_pool_size="1GB", rmm_maximum_pool_size="5GB",
                           device_memory_limit="100GB", dashboard_address="")
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
        ref = random.uniform_numpy((20000, 20000), seed=1).sum()
        assert abs(total - ref) / ref < 1e-12


@pytest.mark.parametrize("memory_limit, expect_disk", [("auto", False), ("1GB", True)])
def test_transpose_sum_spilling_gives_reference(memory_limit, expect_disk, tmp_path):
    args = ["run", "transpose-sum", "--json", "--verify", "--param", "size=20000x20000",
            "--param", "chunks=2500x2500", "--device-memory-limit", "1GB", "--memory-limit", memory_limit,
            "--rmm-pool-size", "4GB", "--local-directory", str(tmp_path), "--dashboard-address", ""]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    print(json.dumps({k: report[k] for k in ("wall_s", "bytes_spilled", "spill", "verify")}, indent=1))
    assert report["verify"]["ok"]
    assert report["bytes_spilled"] > 0
    moves = [w["moves"] for w in report["spill"].values()]
    assert sum(m["device_to_host"]["bytes"] for m in moves) > 0
    assert sum(m["host_to_device"]["bytes"] for m in moves) > 0
    if expect_disk:
        assert sum(m["host_to_disk"]["bytes"] for m in moves) > 0
        assert sum(m["disk_to_host"]["bytes"] for m in moves) > 0


def test_admission_refuses_what_fits_nowhere():
    result = CliRunner().invoke(
        main,
        ["run", "transpose-sum", "--param", "size=2000000x2000000", "--device-memory-limit", "1GB",
         "--memory-limit", "1GB", "--dashboard-address", ""],
    )
    assert result.exit_code == 3, result.output
    assert "exceeds the cluster's device + host + disk capacity" in result.output
