"""What notebooks show: HTML tables, figures of reports and benchmark results, bars."""

from __future__ import annotations

import io
import json

import pytest

from spillway_bench.figure import plot as bench_plot
from spillway.run.bars import advance, progress_bar
from spillway.service.client.job_html import job_html
from spillway.run.report import Report, plot, report_html

PNG = b"\x89PNG\r\n\x1a\n"

REPORT = {
    "workflow": "transpose-sum",
    "params": {"size": [800, 800], "chunks": "auto", "dtype": "float64", "seed": 0, "input": "random"},
    "wall_s": 1.25,
    "result": {"sum": 639936.5, "dtype": "float64", "shape": [800, 800]},
    "verify": {"rel_error": 2.5e-16, "tolerance": 1e-10, "ok": True, "reference": "numpy float64 (x + x.T).sum()"},
    "cluster": {"kind": "gpu", "n_workers": 2, "protocol": "ucx"},
    "footprint": {"total_bytes": 6_000_000, "per_worker_bytes": 3_000_000, "input_bytes": 5_120_000},
    "admission": {},
    "tasks": 38,
    "bytes_produced": 10_240_000,
    "bytes_read": 0,
    "bytes_written": 0,
    "output": None,
    "bytes_transferred": 2_560_000,
    "exchange_rounds": {"ipc": 2},
    "transfer_gbps_median": 80.0,
    "bytes_spilled": 3_000_000_000,
    "spilled_by_tier": {"device_to_host": 2_000_000_000, "host_to_disk": 1_000_000_000},
    "peak_bytes_per_worker": {"ucx://127.0.0.1:4001": 4_000_000, "ucx://127.0.0.1:4002": 3_500_000},
    "memory_measure": "rmm",
    "spill": {
        "ucx://127.0.0.1:4001": {"moves": {"device_to_host": {"bytes": 2_000_000_000, "seconds": 0.1, "gbps": 20.0},
                                           "host_to_device": {"bytes": 1_000_000_000, "seconds": 0.1, "gbps": 10.0}},
                                 "wait_s": 0.01, "prefetched_bytes": 0, "ondemand_events": 0, "ondemand_bytes": 0,
                                 "resident": {}},
        "ucx://127.0.0.1:4002": {"moves": {"host_to_disk": {"bytes": 1_000_000_000, "seconds": 1.0, "gbps": 1.0}},
                                 "wait_s": 0.0, "prefetched_bytes": 0, "ondemand_events": 0, "ondemand_bytes": 0,
                                 "resident": {}},
    },
}

JOB = {
    "id": "abc123", "tenant": "alice", "workflow": "transpose-sum", "params": {"size": "400x400"}, "verify": True,
    "output": False, "priority": 0, "idempotency_key": None, "state": "failed", "cancel_requested": False,
    "progress": {"tasks_done": 3, "tasks_total": 38, "fraction": 3 / 38}, "footprint_bytes": 1_280_000,
    "attempts": 1, "bytes_spilled": 0, "error": "MemoryError: <out of memory>",
    "timings": {"created": "2026-01-01T00:00:00", "started": "2026-01-01T00:00:01", "finished": None, "wall_s": None},
}

BENCH = {
    "machine": {"name": "2x-nvidia-h200"}, "sizes": "small", "ceilings": {"peer_copy": 300.0},
    "workloads": [
        {"name": "W1", "spillway_s": 1.0, "baseline_s": 2.0, "speedup": 2.0,
         "spillway": {"transfer_gbps_median": 150.0}, "baseline": {"transfer_gbps_median": 40.0}},
        {"name": "W2", "spillway_s": 3.0, "baseline_s": None, "speedup": None,
         "spillway": {"transfer_gbps_median": None}, "baseline": {"error": "out of memory"}},
    ],
}


def png_of(fig) -> bytes:
    data = fig._repr_png_()
    assert data.startswith(PNG)
    return data


def test_report_html_has_every_row_and_escapes():
    html = report_html({**REPORT, "output": "/tmp/<x>.zarr"})
    for text in ("spillway run: transpose-sum", "2 gpu workers over ucx", "size=800x800", "sum=639936",
                 "1.250 s (38 tasks)", "2.44 MiB between workers (median 80.00 GB/s)", "2.79 GiB",
                 "device→host=1.86 GiB", "ucx://127.0.0.1:4001</code>: 3.81 MiB", "relative error 2.500e-16",
                 "&lt;x&gt;.zarr"):
        assert text in html, text
    assert "<x>" not in html
    failed = report_html({**REPORT, "verify": {**REPORT["verify"], "ok": False, "rel_error": 1.0}})
    assert ">FAILED<" in failed


def test_job_html_shows_state_progress_and_escaped_error():
    html = job_html(JOB)
    assert "spillway job abc123" in html and ">failed<" in html
    assert "<progress value='3' max='38'>" in html and "3/38 tasks" in html
    assert "MemoryError: &lt;out of memory&gt;" in html and "size=400x400" in html


def test_report_is_the_plain_dict_with_text_and_html(tmp_path):
    report = Report(REPORT)
    assert report == REPORT and json.loads(json.dumps(report)) == REPORT
    assert str(report).splitlines()[0].startswith("workflow      transpose-sum  (gpu, 2 workers, ucx)")
    assert "exchanged     2 round(s) over ipc (the exchanges' steps)" in str(report).splitlines()
    assert report._repr_html_() == report_html(REPORT)


def test_report_figure_from_a_dict_or_its_file(tmp_path):
    fig = Report(REPORT).plot()
    mem, moved = fig.axes
    assert [round(p.get_height(), 2) for p in mem.patches] == [4.0, 3.5]  # MB, one bar per worker
    assert mem.get_ylabel() == "MB" and moved.get_ylabel() == "GB"
    # the title's sizes in the axes' (decimal) units
    assert fig._suptitle.get_text().endswith("5.12 MB in, 2.56 MB between workers, 3 GB spilled")
    assert moved.get_title() == "bytes spilled and restored per worker"
    assert {t.get_text() for t in moved.get_legend().get_texts()} == {"device→host", "host→device", "host→disk"}
    png_of(fig)

    path = tmp_path / "report.json"
    path.write_text(json.dumps({**REPORT, "spill": None}))
    fig = plot(str(path))
    _, moved = fig.axes
    assert [t.get_text() for t in moved.get_xticklabels()] == ["transferred", "device→host", "host→disk"]
    assert [round(p.get_height(), 2) for p in moved.patches] == [0.0, 2.0, 1.0]  # GB
    png_of(fig)


def test_bench_figure():
    fig = bench_plot(BENCH)
    times, bandwidth = fig.axes
    assert [p.get_height() for p in times.patches] == [1.0, 3.0, 2.0, 0]
    assert "peer copy 300 GB/s" in [t.get_text() for t in bandwidth.get_legend().get_texts()]
    assert "2x-nvidia-h200" in fig._suptitle.get_text()
    png_of(fig)


def test_plot_refuses_what_it_cannot_draw(tmp_path):
    with pytest.raises(ValueError, match="not a run report"):
        plot({"state": "done"})
    with pytest.raises(ValueError, match="benchmark results .*spillway_bench.figure.plot draws them"):
        plot(BENCH)
    with pytest.raises(ValueError, match="not benchmark results"):
        bench_plot(REPORT)
    with pytest.raises(TypeError, match="got int"):
        plot(3)
    with pytest.raises(FileNotFoundError):
        plot(tmp_path / "missing.json")


def test_text_bar_grows_with_the_graph():
    stream = io.StringIO()
    bar = progress_bar("run", stream)
    advance(bar, 0, 0)
    advance(bar, 5, 10, "running")
    advance(bar, 30, 40)
    bar.close()
    text = stream.getvalue()
    assert "run:  50%" in text and "5/10" in text and "running" in text and "30/40" in text


def test_complex_checksums_and_shapes_read_as_what_they_are():
    fft = {**REPORT, "workflow": "fft",
           "result": {"shape": [4096, 2048], "chunks": [1024, 2048], "dtype": "complex128",
                      "checksum": [4229641.33, 5.45e-12]}}
    line = [l for l in str(Report(fft)).splitlines() if l.startswith("result")][0]
    assert line == ("result        shape=4096x2048, chunks=1024x2048, dtype=complex128, "
                    "checksum=4.22964e+06+5.45e-12j")
