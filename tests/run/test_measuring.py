"""spillway.run.measuring, the supported way to read what a cluster's workers did: each
reading answers ``client.run`` in the shape its module documents, on CPU workers after a
rechunk through the collective and after the tiered store spilled."""

from __future__ import annotations

from types import SimpleNamespace

import dask.array as da
import numpy as np
import pytest

from spillway.run import measuring

MB = 1 << 20

PHASES_KEYS = {"seconds", "counts", "median", "taken_bytes"}
STATS_KEYS = {"bytes", "seconds", "count", "wait_s", "producer_wait_s", "spill_alloc_s", "prefetched_bytes",
              "drained_bytes", "ahead_said_bytes", "room_written_bytes", "limit_written_bytes", "needed_written_bytes",
              "clean_bytes",
              "ondemand_events", "ondemand_bytes"}
MEASURE_KEYS = {"collective", "step", "plane", "decode", "store_moves", "store"}


def _check_decode(found: dict) -> None:
    assert {"gpu", "host", "stages", "host_buffers"} <= set(found), found
    for place in ("gpu", "host"):
        assert set(found[place]) == {"bytes", "frames", "seconds"}


@pytest.mark.timeout(120)
def test_after_a_collective_rechunk_each_worker_says_its_phases():
    from distributed import Client, LocalCluster

    from spillway.datapath.collective import CollectivePlacement, rechunk

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(CollectivePlacement())
        before = client.run(measuring.collective_phases)
        assert set(before.values()) == {None}  # no collective ran yet
        x = da.random.default_rng(1).random((60, 40), chunks=(10, 40)).persist()
        y = rechunk(x, (60, 8))
        assert any(name.startswith("spillway-cut-") for name in y.dask.layers)
        assert np.array_equal(client.compute(y).result(timeout=60), x.compute())

        phases = [p for p in client.run(measuring.collective_phases).values() if p is not None]
        assert phases
        for p in phases:
            assert set(p) == PHASES_KEYS
            assert set(p["seconds"]) == set(p["counts"]) == set(p["median"])
            assert all(s >= 0 for s in p["seconds"].values()) and p["taken_bytes"] >= 0
        counts: dict = {}
        for p in phases:
            for name, n in p["counts"].items():
                counts[name] = counts.get(name, 0) + n
        # six cuts, five assemblies
        assert counts["cut_plan"] == counts["cut_launch"] == counts["cut_store"] == counts["layout"] == 6, counts
        assert counts["pieces"] == counts["join"] == 5, counts

        assert set(client.run(measuring.plane_counters).values()) == {None}  # no data plane here
        assert set(client.run(measuring.store_moves).values()) == {None}  # distributed's own store
        assert set(client.run(measuring.store_summary).values()) == {None}
        for found in client.run(measuring.decode_counters).values():
            _check_decode(found)
        for found in client.run(measuring.measure).values():
            assert set(found) == MEASURE_KEYS
            assert found["plane"] is None and found["store"] is None


@pytest.mark.timeout(120)
def test_after_a_rechunk_s_steps_each_worker_says_their_phases():
    from distributed import Client, LocalCluster

    from spillway.datapath.collective import CollectivePlacement, rechunk
    from spillway.datapath.step.coordinator import StepCoordinator

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(StepCoordinator())
        client.register_plugin(CollectivePlacement())
        assert set(client.run(measuring.step_phases).values()) == {None}  # no step ran yet
        x = da.random.default_rng(1).random((60, 40), chunks=(10, 40)).persist()
        y = rechunk(x, (60, 8))
        assert any(name.startswith("spillway-step-") for name in y.dask.layers)
        assert np.array_equal(client.compute(y).result(timeout=60), x.compute())
        phases = [p for p in client.run(measuring.step_phases).values() if p is not None]
        assert len(phases) == 2  # a step a worker
        for p in phases:
            assert set(p) == PHASES_KEYS | {"transports"}
            # one round over the transport both offered (host without UCXX, ucxx with it)
            assert len(p["transports"]) == 1 and set(p["transports"].values()) == {1}
            # one step each: its start and its rendezvous; one round: its receives posted, its
            # peers' pieces cut, its own cut, the move, a join and a store
            assert {name: p["counts"][name] for name in p["counts"]} == {
                "step_begin": 1, "step_rendezvous": 1, "step_post": 1, "step_cut": 1, "step_own": 1,
                "step_move": 1, "step_join": 1, "step_store": 1}
        # each received the other's rows of its columns: half of the 60 x 40 float64s in all
        # (three column chunks one worker's, two the other's)
        assert sorted(p["taken_bytes"] for p in phases) == [30 * 16 * 8, 30 * 24 * 8]
        for found in client.run(measuring.measure).values():
            assert set(found) == MEASURE_KEYS and found["step"] is not None


@pytest.mark.timeout(120)
def test_after_a_spill_the_store_says_its_moves():
    from distributed import Client, LocalCluster, wait
    from numpy_codec import NumpyCodec

    from spillway.memory.store import MOVES, TieredStore

    store = TieredStore(device_limit=4 * MB, host_limit=256 * MB, codec=NumpyCodec())
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0",
                      data=store) as cluster, Client(cluster) as client:
        before = next(iter(client.run(measuring.store_moves).values()))
        # the moves between the tiers it has: device and host here, no disk
        assert set(before) == STATS_KEYS and set(before["bytes"]) == {"device_to_host", "host_to_device"} < set(MOVES)
        x = da.random.default_rng(2).random(8 * MB // 8, chunks=MB // 8).persist()
        wait(x)  # 8 MiB on a device tier of 4: half goes to host
        moves = next(iter(client.run(measuring.store_moves).values()))
        assert set(moves) == STATS_KEYS
        assert moves["bytes"]["device_to_host"] >= 4 * MB and moves["count"]["device_to_host"] >= 4, moves
        assert moves["seconds"]["device_to_host"] > 0
        summary = next(iter(client.run(measuring.store_summary).values()))
        assert summary["host_bytes"] >= 4 * MB and summary["device_bytes"] <= 4 * MB
        assert summary["stats"] == moves
        assert set(summary["tiers"]) == {"device", "host"}
        found = next(iter(client.run(measuring.measure).values()))
        assert set(found) == MEASURE_KEYS and found["store_moves"] == moves
        assert found["collective"] is None and found["step"] is None and found["plane"] is None
        _check_decode(found["decode"])
        assert float(x.sum().compute()) > 0


def test_the_plane_s_counters_come_with_its_traces_when_asked():
    from spillway.datapath.plane import hook
    from spillway.datapath.plane.plane import Counters

    counters = Counters()
    counters.fetched, counters.fetched_bytes = 1, 100
    counters.fetch_trace.append({"reply": 0.002, "allocate": 0.001, "frames": 0.003})
    counters.serve_trace.append({"read": 0.001, "produced": 0.0, "frames": 0.002})
    plugin = SimpleNamespace(plane=SimpleNamespace(counters=counters))
    worker = SimpleNamespace(address="ucx://127.0.0.1:1", plugins={hook.PLUGIN_NAME: plugin})
    try:
        plain = measuring.plane_counters(worker)
        assert plain["fetched"] == 1 and plain["fetched_bytes"] == 100
        assert "fetch_trace" not in plain and "serve_trace" not in plain
        assert plain["phases"]["fetch_reply"]["median_s"] == 0.002
        traced = measuring.plane_counters(worker, traces=True)
        assert traced["fetch_trace"] == [{"reply": 0.002, "allocate": 0.001, "frames": 0.003}]
        assert traced["serve_trace"] == [{"read": 0.001, "produced": 0.0, "frames": 0.002}]
    finally:
        plugin.plane = None
    assert measuring.plane_counters(worker) is None
