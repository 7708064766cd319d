"""The forced-bytes bound: what the capacities force each move to carry, from a store's
peak, its limits and what it held below the device when the run began."""

from __future__ import annotations

import pytest

from spillway_bench.bounds import forced_bound, forced_moves, worker_forced

GB = 10**9


def snap(device_limit, host_limit, *, host=0, disk=0, peak=None):
    return {"store": {"tiers": {"device": {"limit": device_limit}, "host": {"limit": host_limit}, "disk": {}},
                      "host_bytes": host, "disk_raw_bytes": disk, "peak_bytes": peak}}


def test_a_run_past_device_and_host_is_forced_down_by_what_it_holds_over_them():
    # O4 on one H100 as filed: device tier 63.7, host tier 111.3, footprint 176.7; the
    # inputs (88.35) held 24.65 on the host when the clock started
    start = snap(63.7 * GB, 111.3 * GB, host=24.65 * GB)
    end = snap(63.7 * GB, 111.3 * GB, peak=176.7 * GB)
    w = worker_forced(start, end)
    assert w["moves"]["device_to_host"] == pytest.approx(88.35 * GB)
    assert w["moves"]["host_to_device"] == pytest.approx(24.65 * GB)
    assert w["moves"]["host_to_disk"] == pytest.approx(1.7 * GB)
    assert w["moves"]["disk_to_host"] == 0


def test_values_on_disk_at_the_start_are_read_once_and_need_no_second_write():
    start = snap(10 * GB, 10 * GB, host=10 * GB, disk=5 * GB)
    end = snap(10 * GB, 10 * GB, peak=40 * GB)
    moves = worker_forced(start, end)["moves"]
    assert moves == {"device_to_host": 15 * GB, "host_to_device": 15 * GB, "host_to_disk": 15 * GB,
                     "disk_to_host": 5 * GB}


def test_a_run_that_fits_is_forced_to_move_nothing():
    start = snap(80 * GB, 100 * GB)
    end = snap(80 * GB, 100 * GB, peak=50 * GB)
    assert set(worker_forced(start, end)["moves"].values()) == {0}


def test_workers_without_a_peak_have_no_forced_bytes():
    assert worker_forced({"store": None}, {"store": None}) is None
    assert forced_moves({"a": {"store": None}}, {"a": {"store": None}}) is None
    assert forced_bound(None, {}, {}, 1, 1.0) is None


def test_workers_are_forced_one_by_one_and_summed():
    # one worker over its device by 5, the other under: the sum is 5, not 0
    start = {"a": snap(10 * GB, 100 * GB), "b": snap(10 * GB, 100 * GB)}
    end = {"a": snap(10 * GB, 100 * GB, peak=15 * GB), "b": snap(10 * GB, 100 * GB, peak=2 * GB)}
    forced = forced_moves(start, end)
    assert forced["moves"]["device_to_host"] == 5 * GB and forced["peak_bytes"] == 17 * GB


def test_the_bound_prices_forced_bytes_at_the_ceilings_and_says_how_much_more_moved():
    forced = {"moves": {"device_to_host": 55 * GB, "host_to_device": 0, "host_to_disk": 2 * GB, "disk_to_host": 0},
              "peak_bytes": 100 * GB}
    moved = {"device_to_host": 110 * GB, "host_to_device": 30 * GB, "host_to_disk": 20 * GB, "disk_to_host": 5 * GB}
    gbps = {"d2h_pinned": 55.0, "h2d_pinned": 55.0, "disk_write": 2.0, "disk_read": 2.0}
    b = forced_bound(forced, moved, gbps, links=1, seconds=8.0)
    assert b["forced_bound_s"] == pytest.approx(1.0 + 1.0)
    assert b["time_over_forced"] == pytest.approx(4.0)
    assert b["moved_over_forced"]["device_to_host"] == pytest.approx(2.0)
    assert b["moved_over_forced"]["host_to_disk"] == pytest.approx(10.0)
    # nothing forced: no ratio, whatever moved
    assert b["moved_over_forced"]["disk_to_host"] is None


def test_a_forced_move_without_a_ceiling_leaves_the_bound_unknown():
    forced = {"moves": {"device_to_host": GB, "host_to_device": 0, "host_to_disk": 0, "disk_to_host": 0},
              "peak_bytes": GB}
    b = forced_bound(forced, {}, {}, links=1, seconds=1.0)
    assert b["forced_bound_s"] is None and b["missing"] == ["d2h_pinned"] and b["time_over_forced"] is None
