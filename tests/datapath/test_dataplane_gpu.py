"""The data plane between GPU workers: CuPy chunks over CUDA IPC (NVLink between two GPUs,
a copy within the device between two workers of one GPU), bit for bit, received into the
receiver's RMM pool and counted by its tiered store; the comm path with the plane off."""

from __future__ import annotations

import pytest

from spillway.run.measuring import plane_counters
from spillway_bench.transfers import moves

pytestmark = pytest.mark.gpu

SIZES = (16 * 2**20, 256 * 2**20)


def _options(**changes):
    from spillway.options.settings import Options

    return Options.resolve(protocol="ucx", rmm_pool_size="8GB", dashboard_address="", **changes)


def _received_in_store(dask_worker=None):
    from spillway.launch.plugins import PLUGIN_NAME

    store = dask_worker.plugins[PLUGIN_NAME]
    return type(dask_worker.data).__name__, len(dask_worker.data), store.kind


@pytest.mark.parametrize("layout", ["two GPUs", "one GPU, two workers"])
@pytest.mark.parametrize("plane", [True, False], ids=["plane", "comm"])
def test_cupy_chunks_move_bit_for_bit_on_the_plane_or_the_comm(gpu_count, layout, plane):
    if layout == "two GPUs" and gpu_count < 2:
        pytest.skip("needs two GPUs")
    from spillway.launch import open_cluster, ucxx_installed

    if not ucxx_installed():  # the plane and these moves are UCXX's (a CUDA extra brings it)
        pytest.skip("needs distributed-ucxx (protocol ucx)")

    changes = {"devices": "0,1"} if layout == "two GPUs" else {"devices": "0", "workers_per_gpu": 2}
    with open_cluster(_options(data_plane=plane, **changes)) as session:
        client = session.client
        before = client.run(plane_counters)
        measured = moves(client, SIZES, repeats=2)
        after = client.run(plane_counters)
        stores = client.run(_received_in_store)
    assert all(m["same_bits"] for m in measured), measured
    receiver = sorted(after)[1]
    if plane:
        # a warm-up and two timed moves per size, each one fetch on the receiver
        assert after[receiver]["fetched"] - before[receiver]["fetched"] == 3 * len(SIZES)
        assert after[receiver]["fetched_bytes"] - before[receiver]["fetched_bytes"] >= 3 * sum(SIZES)
        assert after[receiver]["lost"] == 0
        # each chunk went into a receive posted before it was asked for
        assert after[receiver]["slotted"] - before[receiver]["slotted"] == 3 * len(SIZES)
    else:
        assert all(c is None for c in after.values())
    assert all(name == "TieredStore" and kind == "gpu" for name, _, kind in stores.values()), stores
