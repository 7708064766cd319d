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
    # no bokeh here: the performance report says why it is missing
    if tl["performance_report"] != "included":
        assert tl["performance_report"].startswith("not written: ")
    plain, nothing = timed_run_recorded(cpu_client, w.direct(w.params("tiny"), "numpy", 6), kind="cpu",
                                                timeout=60, record=False)
    assert nothing is None and plain.seconds > 0


def test_performance_report_is_asked_of_the_scheduler_after_the_run(cpu_client, monkeypatch):
    # bokeh is not installed here: a stand-in handler on the (in-process) scheduler
    asked = []

    async def report(start, last_count, code="", mode=None):
        asked.append((start, last_count, code))
        return "<html>report</html>"

    scheduler = cpu_client.cluster.scheduler
    monkeypatch.setitem(scheduler.handlers, "performance_report", report)
    real = timeline.importlib.util.find_spec
    monkeypatch.setattr(timeline.importlib.util, "find_spec", lambda name: True if name == "bokeh" else real(name))
    w = workloads.WORKLOADS["W1"]
    measure, tl = timed_run_recorded(cpu_client, w.direct(w.params("tiny"), "numpy", 7), kind="cpu",
                                             timeout=60, record=True)
    assert tl[timeline.REPORT_KEY] == "<html>report</html>" and tl["performance_report"] == "included"
    (start, count, code), = asked
    assert start <= measure.window[0] and isinstance(count, int) and "timed run" in code


# --- files


def _results(runs: dict[str, dict[str, dict]]) -> dict:
    return {"machine": {"name": "m"}, "label": None,
            "workloads": [{"name": name, **{side: {"timeline": tl} for side, tl in sides.items()}}
                          for name, sides in runs.items()]}


def _fake(wall=1.0, report=None) -> dict:
    s = timeline.summarize((0.0, wall), {"tcp://a": {"compute": [(0.1, 0.5)], "transfer": [(0.5, 0.7)]},
                                         "tcp://b": {"compute": [(0.2, 0.9)]}})
    s["names"] = {"tcp://a": "w0", "tcp://b": "w1"}
    if report is not None:
        s[timeline.REPORT_KEY] = report
    return s


def test_one_png_and_one_html_for_all_runs_kept_across_merged_parts(tmp_path):
    from matplotlib import image

    first = _results({"W1": {"spillway": _fake(report="<html>W1 sp & co</html>"),
                             "baseline": _fake(report="<html>W1 base</html>")}})
    paths = timeline.write_files(first, tmp_path, "run")
    assert sorted(paths) == ["timeline_html", "timeline_png"]
    assert timeline.REPORT_KEY not in json.dumps(first)
    assert first["workloads"][0]["spillway"]["timeline"]["performance_report"] == "run-timeline.html"
    pixels = image.imread(paths["timeline_png"])
    assert pixels.shape[0] > 200 and pixels.std() > 0.01

    # a later part of the same results file: W1's sections stay, W2's join them
    later = _results({"W1": {"spillway": _fake(), "baseline": _fake()},
                      "W2": {"spillway": _fake(report="<html>W2 sp</html>")}})
    timeline.write_files(later, tmp_path, "run")
    page = (tmp_path / "run-timeline.html").read_text()
    assert [page.count(f"<!-- section {k} -->") for k in ("W1 spillway", "W1 baseline", "W2 spillway")] == [1, 1, 1]
    assert "W1 sp &amp; co" in page  # escaped once, for srcdoc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-timeline.html", "run-timeline.png"]


def test_reports_past_the_size_limit_are_left_out_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "HTML_LIMIT", 500)
    results = _results({"W1": {"spillway": _fake(report="x" * 300), "baseline": _fake(report="y" * 300)}})
    timeline.write_files(results, tmp_path, "run")
    sides = results["workloads"][0]
    assert sides["spillway"]["timeline"]["performance_report"] == "run-timeline.html"
    assert sides["baseline"]["timeline"]["performance_report"].startswith("left out of run-timeline.html")


def test_no_recorded_run_writes_nothing(tmp_path):
    assert timeline.write_files(_results({}), tmp_path, "run") == {}
    assert timeline.write_files({"workloads": {"W1": []}}, tmp_path, "scaling") == {}  # the scaling report
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
    assert set(files) <= {f"{stem}.json", f"{stem}.md", f"{stem}.png", f"{stem}.log", f"{stem}-timeline.png",
                          f"{stem}-timeline.html"} and len(files) >= 5
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    (w,) = data["workloads"]
    for side in ("spillway", "baseline"):
        tl = w[side]["timeline"]
        _adds_up(tl, max(w[side]["runs_s"]))  # the slowest timed run is the one kept
    md = (tmp_path / f"{stem}.md").read_text()
    assert "## Timeline of the slowest timed run" in md and "| W2 | baseline |" in md
    assert f"wrote {tmp_path / stem}-timeline.png" in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_scaling_timeline_keeps_every_part_in_one_png(tmp_path):
    result = CliRunner().invoke(main, ["bench-scaling", "run", "--cpu", "--n-workers", "2", "--mode", "weak",
                                       "--sizes", "tiny", "--only", "W1,B2", "--no-ceilings", "--timeline",
                                       "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (f,) = tmp_path.glob("*.json")
    data = json.loads(f.read_text())
    assert [w["name"] for w in data["workloads"]] == ["W1", "B2"]  # two parts, one file
    for w in data["workloads"]:
        _adds_up(w["spillway"]["timeline"], max(w["spillway"]["runs_s"]))
        assert "timeline" not in (w.get("baseline") or {}) or not w["baseline"].get("timeline")
    assert (tmp_path / f"{f.stem}-timeline.png").stat().st_size > 10_000
    assert len(list(tmp_path.iterdir())) <= 8


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
