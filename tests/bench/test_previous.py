"""Nothing gets slower unseen: a bench result against the previous committed result of its
machine, row by row."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from spillway_bench import previous, render
from spillway_bench.suite import against_previous

MACHINE = "2x-test-gpu"


def _row(name, sides, *, input_bytes=1000, chunk_bytes=100):
    """A workload entry: ``sides`` maps a side to its median, or (median, first run), or
    an error string."""
    entry = {"name": name, "spillway_s": None, "input_bytes": input_bytes, "chunk_bytes": chunk_bytes}
    for side, value in sides.items():
        if isinstance(value, str):
            entry[side] = {"median_s": None, "first_s": None, "error": value}
        elif isinstance(value, tuple):
            entry[side] = {"median_s": value[0], "first_s": value[1], "error": None}
        else:
            entry[side] = {"median_s": value, "error": None}
    if any(isinstance(v, tuple) for v in sides.values()):
        entry["out_of_core"] = {"sides": {}}
    entry["spillway_s"] = (entry.get("spillway") or {}).get("median_s")
    return entry


def _results(rows, *, machine=MACHINE, sizes="full", finished="2026-11-28T10:00:00+00:00", label=None):
    return {"machine": {"name": machine}, "sizes": sizes, "runs": 3, "label": label,
            "started": finished, "finished": finished, "workloads": rows}


def _write(directory, name, results):
    path = directory / name
    path.write_text(json.dumps(results))
    return path


def test_a_row_20_percent_slower_is_listed_5_percent_is_not_and_a_new_row_is_new(tmp_path):
    _write(tmp_path, "before.json", _results([
        _row("W1", {"spillway": 1.0, "baseline": 2.0}),
        _row("O3", {"spillway": (10.0, 20.0), "tasks_method": (30.0, 40.0)}),
    ], finished="2026-11-27T10:00:00+00:00"))
    now = _results([
        _row("W1", {"spillway": 1.2, "baseline": 2.1}),          # +20%, +5%
        _row("O3", {"spillway": (9.0, 25.0), "tasks_method": (31.0, 40.0), "baseline": "P2P failed"}),
        _row("O4", {"spillway": (5.0, 6.0)}),
    ])
    out = against_previous(now, tmp_path)
    assert out["previous"]["file"] == str(tmp_path / "before.json") and out["previous"]["committed_only"] is False
    slower = {(r["name"], r["side"], r["metric"]): r for r in out["slower"]}
    assert set(slower) == {("W1", "spillway", "median_s"), ("O3", "spillway", "first_s")}
    assert slower[("W1", "spillway", "median_s")]["ratio"] == pytest.approx(1.2)
    assert slower[("W1", "spillway", "median_s")]["previous_s"] == 1.0
    assert slower[("O3", "spillway", "first_s")]["ratio"] == pytest.approx(1.25)
    new = {(r["name"], r["side"], r["metric"]) for r in out["new"]}
    # O4 everywhere, and O3's baseline, which the earlier file did not hold
    assert new == {("O4", "spillway", "median_s"), ("O4", "spillway", "first_s"),
                   ("O3", "baseline", "median_s"), ("O3", "baseline", "first_s")}
    assert out["previous"]["rows_compared"] == 6
    now.update(out)
    lines = previous.lines(now)
    assert lines[0] == "previous result: before.json; 6 rows compared, 2 slower by more than 10%, 4 new"
    assert "slower: W1 spillway: 1.200 s, +20% (was 1.000 s in before.json)" in lines
    assert "slower: O3 spillway first run: 25.000 s, +25% (was 20.000 s in before.json)" in lines


def test_each_row_is_compared_with_the_newest_earlier_file_holding_it_at_the_same_sizes(tmp_path):
    _write(tmp_path, "old.json", _results([_row("W1", {"spillway": 1.0}), _row("W2", {"spillway": 1.0})],
                                          finished="2026-11-20T10:00:00+00:00"))
    # newer: W2 only at other sizes, W1 not at all (an --only run), then one of another machine
    _write(tmp_path, "newer.json", _results([_row("W2", {"spillway": 0.1}, input_bytes=999)],
                                            finished="2026-11-26T10:00:00+00:00"))
    _write(tmp_path, "tiny.json", _results([_row("W2", {"spillway": 0.1})], sizes="tiny",
                                           finished="2026-11-26T11:00:00+00:00"))
    _write(tmp_path, "other.json", _results([_row("W1", {"spillway": 0.1})], machine="1x-other",
                                            finished="2026-11-27T10:00:00+00:00"))
    # files in the directory that are no bench results: skipped
    (tmp_path / "link.json").write_text(json.dumps({"machine": {"name": MACHINE}, "sweep": []}))
    (tmp_path / "broken.json").write_text("{")
    now = _results([_row("W1", {"spillway": 1.05}), _row("W2", {"spillway": "CUDA out of memory"})])
    # the file being written does not count as its own previous result
    mine = _write(tmp_path, "mine.json", _results([_row("W1", {"spillway": 0.01})],
                                                  finished="2026-11-28T10:00:00+00:00"))
    out = against_previous(now, tmp_path, exclude=(mine,))
    assert out["previous"]["file"] == str(tmp_path / "tiny.json")
    assert out["new"] == []
    # W1 within 10% of old.json's; W2 failed where it ran in 1 s: listed
    (row,) = out["slower"]
    assert (row["name"], row["seconds"], row["previous_s"], row["error"]) == ("W2", None, 1.0, "CUDA out of memory")
    assert row["file"] == str(tmp_path / "old.json")
    assert out["previous"]["files_compared"] == [str(tmp_path / "old.json")]
    now.update(out)
    assert "slower: W2 spillway: failed: CUDA out of memory (was 1.000 s in old.json)" in previous.lines(now)
    # one file named by hand: only that one
    alone, _ = previous.earlier_results(tmp_path / "old.json", MACHINE)
    assert [p.name for p, _ in alone] == ["old.json"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_only_committed_results_count_where_the_directory_is_in_git(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "bench@example.com")
    git("config", "user.name", "bench")
    results = tmp_path / "results"
    results.mkdir()
    _write(results, "committed.json", _results([_row("W1", {"spillway": 1.0})], finished="2026-11-20T10:00:00+00:00"))
    git("add", "results/committed.json")
    git("commit", "-qm", "a result")
    # a later local run, never committed: not the previous result
    _write(results, "local.json", _results([_row("W1", {"spillway": 0.1})], finished="2026-11-27T10:00:00+00:00"))
    out = against_previous(_results([_row("W1", {"spillway": 1.3})]), results)
    assert out["previous"]["file"] == str(results / "committed.json") and out["previous"]["committed_only"]
    assert [(r["name"], r["previous_s"]) for r in out["slower"]] == [("W1", 1.0)]


def test_no_earlier_result_makes_every_row_new_and_the_report_says_so(tmp_path):
    now = _results([_row("W1", {"spillway": 1.0, "baseline": 2.0})])
    now.update(against_previous(now, tmp_path / "missing"))
    assert now["previous"]["file"] is None and now["slower"] == []
    assert [(r["name"], r["side"]) for r in now["new"]] == [("W1", "spillway"), ("W1", "baseline")]
    assert previous.lines(now)[0].startswith("previous result: none of this machine in ")
    section = "\n".join(render.previous_section(now))
    assert "## Against the previous result" in section and "every row is new" in section


def test_the_report_lists_the_slower_rows_and_the_new_ones(tmp_path):
    _write(tmp_path, "before.json", _results([_row("W3", {"spillway": 1.0})], finished="2026-11-27T10:00:00+00:00"))
    now = _results([_row("W3", {"spillway": 1.5}), _row("O3", {"spillway": (1.0, 2.0)})])
    now.update(against_previous(now, tmp_path))
    section = "\n".join(render.previous_section(now))
    assert "| W3 spillway | 1.500 | 1.000 | +50% | `before.json` |" in section
    assert "New rows: O3 spillway, O3 spillway first run." in section


def test_a_previous_file_named_by_hand_must_be_a_bench_result_of_this_machine(tmp_path):
    from spillway_bench import prepare
    from spillway.options.errors import ParamError
    from spillway.options.gpus import Inventory
    from spillway.options.settings import Options

    options = Options.resolve(cpu=True, n_workers=2)
    here = report_machine()
    other = _write(tmp_path, "other.json", _results([_row("W1", {"spillway": 1.0})], machine="1x-other"))
    with pytest.raises(ParamError, match=f"previous: .* holds 1x-other; this run is {here}"):
        prepare(options, only="W1", sizes="tiny", inventory=Inventory(reason="t"), previous=other)
    link = tmp_path / "link.json"
    link.write_text(json.dumps({"machine": {"name": here}, "sweep": []}))
    with pytest.raises(ParamError, match="is not a spillway bench results file"):
        prepare(options, only="W1", sizes="tiny", inventory=Inventory(reason="t"), previous=link)
    mine = _write(tmp_path, "mine.json", _results([_row("W1", {"spillway": 1.0})], machine=here))
    assert prepare(options, only="W1", sizes="tiny", inventory=Inventory(reason="t"), previous=mine).previous == mine


def report_machine() -> str:
    from spillway_bench import report

    return report.describe_machine(None, "cpu")["name"]
