"""The tiers' bound of the out-of-core rows: bytes over the rates of the same bench run,
the per-GPU moves shared among the GPUs, and each side's bound next to its times."""

from __future__ import annotations

import pytest

from spillway_bench import bounds, report, workloads
from spillway_bench.ceilings import Ceilings
from spillway_bench.measure import RunMeasure, SideResult

GBPS = {"d2h_pinned": 50.0, "h2d_pinned": 25.0, "peer_copy": 100.0, "disk_write": 2.0, "disk_read": 4.0}
MOVES = {"device_to_host": 200 * 10**9, "host_to_device": 100 * 10**9, "host_to_disk": 10 * 10**9,
         "disk_to_host": 8 * 10**9}
BETWEEN = 400 * 10**9


def test_each_move_over_its_rate_the_per_gpu_ones_shared_by_the_gpus():
    two = bounds.tiers_bound(MOVES, BETWEEN, GBPS, links=2)
    # 200 GB / (50 GB/s x 2) + 100 / (25 x 2) + 400 / (100 x 2) + 10 / 2 + 8 / 4: the disk is the host's one
    assert two["bound_s"] == pytest.approx(2.0 + 2.0 + 2.0 + 5.0 + 2.0)
    assert two["terms"]["between_workers"] == {"bytes": BETWEEN, "ceiling": "peer_copy", "ceiling_gbps": 100.0,
                                               "divided_by": 2, "seconds": pytest.approx(2.0)}
    assert two["terms"]["host_to_disk"]["divided_by"] == 1 and two["missing"] == [] and two["links"] == 2
    one = bounds.tiers_bound(MOVES, BETWEEN, GBPS, links=1)
    assert one["bound_s"] == pytest.approx(4.0 + 4.0 + 4.0 + 5.0 + 2.0)
    # workers of one GPU: a copy within it is the link between them
    same = bounds.tiers_bound({}, BETWEEN, {"same_gpu_copy": 200.0}, links=2)
    assert same["bound_s"] == pytest.approx(1.0) and same["terms"]["between_workers"]["ceiling"] == "same_gpu_copy"


def test_a_move_without_its_rate_leaves_the_bound_unknown_and_nothing_moved_is_zero():
    partial = bounds.tiers_bound(MOVES, BETWEEN, {"d2h_pinned": 50.0, "h2d_pinned": 25.0}, links=2)
    assert partial["bound_s"] is None and partial["missing"] == ["disk_write", "disk_read", "peer_copy"]
    # a rate that nothing needed is not missing
    nothing = bounds.tiers_bound({"device_to_host": 0}, 0, {}, links=2)
    assert nothing["bound_s"] == 0 and nothing["missing"] == [] and nothing["terms"] == {}


def _spill(d2h, h2d, disk_w=0, disk_r=0):
    values = {"device_to_host": d2h, "host_to_device": h2d, "host_to_disk": disk_w, "disk_to_host": disk_r}
    return {"moves": {m: {"bytes": b, "seconds": None} for m, b in values.items()},
            "restore_wait_s": None, "spill_producer_wait_s": None, "workers": 2}


def _side(runs_s, first_s, spill, moved, first_spill, first_moved):
    side = SideResult(source="direct", runs_s=list(runs_s), spill=[spill] * len(runs_s),
                      bytes_moved=[moved] * len(runs_s))
    side.warmup_s = first_s
    side.record_first(RunMeasure(seconds=first_s, transfers=[], bytes_moved=first_moved, bytes_spilled=0,
                                 spill=first_spill))
    return side


def test_each_side_of_an_o_row_carries_its_bounds_and_the_row_spillway_over_tasks_method():
    o3 = workloads.WORKLOADS["O3"]
    # a made-up run on two GPUs: spillway's timed runs spill 200 GB and restore 100 GB, move
    # 400 GB between the workers, write 10 GB to disk and read 8 GB back
    spillway = _side([12.0, 13.0, 14.0], 26.0, _spill(*MOVES.values()), BETWEEN,
                     _spill(400 * 10**9, 200 * 10**9), 2 * BETWEEN)
    tasks = _side([26.0, 26.0, 27.0], 39.0, _spill(100 * 10**9, 50 * 10**9), BETWEEN,
                  _spill(100 * 10**9, 50 * 10**9), BETWEEN)
    baseline = SideResult(error="RuntimeError: P2P failed during transfer phase",
                          expected_failure=o3.baseline_expected_failure)
    entry = report.workload_entry(o3, "tiny", {"spillway": spillway, "tasks_method": tasks, "baseline": baseline},
                                  Ceilings(gbps=GBPS), n_workers=2, links=2)
    sp, tm, base = entry["spillway"], entry["tasks_method"], entry["baseline"]
    assert sp["bound_s"] == pytest.approx(13.0) and sp["time_over_bound"] == pytest.approx(1.0)
    # first run: 400 / 100 + 200 / 50 + 800 / 200 = 12 s; no disk
    assert sp["first_bound_s"] == pytest.approx(12.0) and sp["first_over_bound"] == pytest.approx(26.0 / 12.0)
    # tasks_method: 100 / 100 + 50 / 50 + 400 / 200 = 4 s
    assert tm["bound_s"] == pytest.approx(4.0) and tm["time_over_bound"] == pytest.approx(26.0 / 4.0)
    assert tm["first_bound_s"] == pytest.approx(4.0) and tm["first_s"] == 39.0
    # a failed side has no time and no bound, with the same fields as the others
    assert base["bound_s"] is None and base["first_s"] is None and base["expected_failure"]
    assert set(sp) == set(tm) == set(base)
    ooc = entry["out_of_core"]
    assert ooc["spillway_over_tasks_method"] == pytest.approx(13.0 / 26.0)
    assert ooc["first_spillway_over_tasks_method"] == pytest.approx(26.0 / 39.0)
    assert ooc["sides"]["spillway"]["first_s"] == 26.0 and ooc["sides"]["baseline"]["error"].startswith("Runtime")
    assert entry["tasks_method_s"] == 26.0 and ooc["footprint_bytes"] == 2 * o3.input_bytes("tiny")
    # a baseline's expected failure is its result: the bench has not failed
    assert report.failed_workloads({"workloads": [entry]}) == []
    md = report.markdown(_results([entry]))
    assert ("| O3 | spillway | — | 26.000 | 13.000 | 12.000 / 13.000 | 2.2x | 1.0x | — / — | — | — | — "
            "| 0.67x / 0.50x |") in md
    assert "| O3 | baseline | — | failed (expected) | — | — / — | — | — | — / — | — | — | — | — |" in md
    short = report.short_table(_results([entry]))
    assert "out of core, a fresh cluster per side:" in short


def test_a_failed_tasks_method_side_fails_the_bench():
    results = {"workloads": [{"name": "O4", "spillway": {"error": None}, "tasks_method": {"error": "boom"},
                              "baseline": {"error": "P2P", "expected_failure": "known"}}]}
    assert report.failed_workloads(results) == ["O4"]


def _results(entries):
    return {"machine": {"name": "m", "gpus": [], "workers": "gpu", "driver_version": None,
                        "cuda_driver_version": None, "cpu": "c", "cores": 1, "memory_total": 1,
                        "platform": "p", "stack": {}},
            "started": "s", "finished": "f", "sizes": "tiny", "runs": 3, "clusters": {}, "ceilings": GBPS,
            "ceilings_skipped": {}, "ceiling_bytes": 1, "workloads": entries, "targets": []}
