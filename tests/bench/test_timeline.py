"""``--timeline``: where a timed run's time goes per worker, on real CPU clusters, and the
few small files written beside the results."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spillway_bench import clusters, timeline, workloads
from spillway_bench.measure import timed_run_recorded
from spillway.cli import main


def _adds_up(tl: dict, wall: float) -> None:
    """Each worker's compute, transfer, other and idle seconds make the run's wall time."""
    assert tl["wall_s"] == pytest.approx(wall, rel=0.03, abs=0.02)
    for addr, w in tl["workers"].items():
        total = w["compute_s"] + w["transfer_s"] + w["other_s"] + w["idle_s"]
        assert total == pytest.approx(wall, rel=0.03, abs=0.02), (addr, w)
        assert min(w["compute_s"], w["transfer_s"], w["other_s"], w["idle_s"]) >= 0
        assert w["transfer_s"] <= w["transfer_total_s"] + 1e-9
        for spans in tl["segments"][addr].values():
            assert all(0 <= a <= b <= tl["wall_s"] + 1e-3 for a, b in spans)


# --- the arithmetic


def test_overlaps_count_once_compute_first_and_the_rest_is_idle():
    window = (100.0, 110.0)
    activity = {
        "a": {"compute": [(99.0, 101.0), (102.0, 104.0), (103.0, 105.0)],  # clipped; overlapping
              "transfer": [(104.5, 106.0), (105.5, 107.0)],  # 0.5 s under compute, 1.5 s alone
              "other": [(106.5, 108.0)]},  # 0.5 s under the transfer
        "b": {"compute": [], "transfer": [], "other": []},
    }
    s = timeline.summarize(window, activity, {"a": {"tasks": 3}})
    a, b = s["workers"]["a"], s["workers"]["b"]
    assert a["compute_s"] == pytest.approx(4.0)
    assert a["transfer_s"] == pytest.approx(2.0) and a["transfer_total_s"] == pytest.approx(2.5)
    assert a["other_s"] == pytest.approx(1.0)
    assert a["idle_s"] == pytest.approx(3.0) and a["tasks"] == 3
    assert b["idle_s"] == pytest.approx(10.0) and b["compute_s"] == 0
    assert s["first_task_s"] == pytest.approx(0.0) and s["tail_s"] == pytest.approx(5.0)
    assert s["segments"]["a"]["compute"] == [[0.0, 1.0], [2.0, 5.0]]
    _adds_up(s, 10.0)


def test_subtract_and_coarsen():
    assert timeline.subtract([(0, 10)], [(1, 2), (3, 4), (9, 12)]) == [(0, 1), (2, 3), (4, 9)]
    assert timeline.subtract([(0, 1), (5, 6)], []) == [(0, 1), (5, 6)]
    assert timeline.coarsen([(0, 1), (1.0001, 2), (3, 4)], gap=0.01) == [[0, 2], [3, 4]]


# --- a real run


@pytest.fixture
def cpu_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster, timeout="30s") as client:
        client.register_plugin(clusters.SpillCounter())
        yield client


@pytest.mark.timeout(120)
def test_recorded_run_adds_up_to_its_wall_time_per_worker(cpu_client):
    w = workloads.WORKLOADS["W2"]
    measure, tl = timed_run_recorded(cpu_client, w.direct(w.params("tiny"), "numpy", 5), kind="cpu",
                                             timeout=60, record=True)
    assert len(tl["workers"]) == 2 and sorted(tl["names"].values()) == ["w0", "w1"]
    _adds_up(tl, measure.seconds)
    assert all(x["compute_s"] > 0 and x["tasks"] > 0 for x in tl["workers"].values())
    # x.dot(y) gathers panels from the other worker: what the bench counted, the timeline shows
    assert sum(x["bytes_in"] for x in tl["workers"].values()) == measure.bytes_moved > 0
    assert sum(x["transfers"] for x in tl["workers"].values()) == len(measure.transfers)
    assert 0 <= tl["first_task_s"] < measure.seconds and 0 <= tl["tail_s"] < measure.seconds
    plain, nothing = timed_run_recorded(cpu_client, w.direct(w.params("tiny"), "numpy", 6), kind="cpu",
                                                timeout=60, record=False)
    assert nothing is None and plain.seconds > 0


# --- files


def _results(runs: dict[str, dict[str, dict]]) -> dict:
    return {"machine": {"name": "m"}, "label": None,
            "workloads": [{"name": name, **{side: {"timeline": tl} for side, tl in sides.items()}}
                          for name, sides in runs.items()]}


def _fake(wall=1.0) -> dict:
    s = timeline.summarize((0.0, wall), {"tcp://a": {"compute": [(0.1, 0.5)], "transfer": [(0.5, 0.7)]},
                                         "tcp://b": {"compute": [(0.2, 0.9)]}})
    s["names"] = {"tcp://a": "w0", "tcp://b": "w1"}
    return s


def test_one_png_for_all_runs(tmp_path):
    from matplotlib import image

    results = _results({"W1": {"spillway": _fake(), "baseline": _fake()}, "W2": {"spillway": _fake()}})
    paths = timeline.write_files(results, tmp_path, "run")
    assert sorted(paths) == ["timeline_png"]
    pixels = image.imread(paths["timeline_png"])
    assert pixels.shape[0] > 200 and pixels.std() > 0.01
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-timeline.png"]


def test_no_recorded_run_writes_nothing(tmp_path):
    assert timeline.write_files(_results({}), tmp_path, "run") == {}
    assert not list(tmp_path.iterdir())


# --- the commands


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_timeline_on_cpu_workers(tmp_path):
    result = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--sizes", "tiny", "--only", "W2",
                                       "--no-ceilings", "--timeline", "--out", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in tmp_path.iterdir())
    (stem,) = {f.split(".")[0] for f in files if f.endswith(".json")}
    # few files: what comes back from the GPU host is at most 8 per command
    assert set(files) == {f"{stem}.json", f"{stem}.md", f"{stem}.png", f"{stem}.log", f"{stem}-timeline.png"}
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    (w,) = data["workloads"]
    for side in ("spillway", "baseline"):
        tl = w[side]["timeline"]
        _adds_up(tl, max(w[side]["runs_s"]))  # the slowest timed run is the one kept
    md = (tmp_path / f"{stem}.md").read_text()
    assert "## Timeline of the slowest timed run" in md and "| W2 | baseline |" in md
    assert f"wrote {tmp_path / stem}-timeline.png" in result.output


def test_bench_and_timeline_count_the_same_transfers_at_the_window_edges():
    from spillway_bench.timeline import in_window

    window = (100.0, 110.0)
    log = [{"start": 99.9995, "stop": 99.9999, "bytes": 320000, "who": "a"},   # ended before the clock
           {"start": 99.5, "stop": 100.2, "bytes": 1, "who": "a"},             # straddles the start
           {"start": 105.0, "stop": 105.1, "bytes": 10, "who": "a"},
           {"start": 109.9, "stop": 110.3, "bytes": 100, "who": "a"},          # straddles the end
           {"start": 110.0, "stop": 110.1, "bytes": 320000, "who": "a"}]       # began after it
    counted = [t["bytes"] for t in log if in_window(t, window)]
    assert counted == [1, 10, 100]
    tl = timeline.from_records(window, [], {"w": log}, ["w"])
    assert tl["workers"]["w"]["bytes_in"] == sum(counted) and tl["workers"]["w"]["transfers"] == 3
