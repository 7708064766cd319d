"""``spillway run`` end to end on CPU workers: the JSON report and the Zarr output."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from reference_inputs import uniform_numpy
from spillway.cli import main

REPORT_KEYS = {"workflow", "params", "wall_s", "result", "verify", "bytes_transferred", "bytes_spilled",
               "peak_bytes_per_worker", "bytes_read", "bytes_written", "footprint"}


def test_run_json_report_with_output(tmp_path):
    import zarr

    out = tmp_path / "fft.zarr"
    result = CliRunner().invoke(main, [
        "run", "fft", "--cpu", "--n-workers", "2", "--dashboard-address", "", "--json", "--verify",
        "--no-progress", "--param", "size=256x64", "--param", "chunks=64x32", "--output", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert REPORT_KEYS <= set(report)
    assert report["workflow"] == "fft"
    assert report["params"]["size"] == [256, 64]
    assert set(report["verify"]) >= {"rel_error", "tolerance", "ok"}
    assert report["verify"]["ok"] and report["verify"]["rel_error"] < 1e-12
    assert report["result"]["dtype"] == "complex128"
    assert report["bytes_written"] == 256 * 64 * 16
    assert report["bytes_transferred"] > 0  # the rechunk to column panels moves chunks
    # the rechunk's exchange is a step a worker over the host kind (CPU workers), one round each
    assert report["exchange_rounds"] == {"host": 2}
    assert len(report["peak_bytes_per_worker"]) == 2
    stored = zarr.open_array(str(out), mode="r")[...]
    expected = np.fft.fft(uniform_numpy((256, 64), seed=0), axis=0)
    assert np.abs(stored - expected).max() < 1e-9


def test_run_without_verify_has_null_verify():
    result = CliRunner().invoke(main, [
        "run", "reduction", "--cpu", "--n-workers", "1", "--dashboard-address", "", "--json", "--no-progress",
        "--param", "op=mean", "--param", "size=100x100",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["verify"] is None
    assert 0.4 < report["result"]["mean"] < 0.6


def test_a_run_past_device_and_host_says_its_disk_traffic_on_stderr_and_in_the_report(monkeypatch):
    # CPU workers of 3 GB run a graph of a few megabytes: the scheduler is told their
    # memory is 1 MiB (its process is this one), so the run goes past it; their stores
    # (distributed's) measure no disk rate, and the line says so
    from spillway.memory import capacity
    from spillway.memory.admission import Capacity

    monkeypatch.setattr(capacity.CapacityPlugin, "capacity",
                        lambda self: (Capacity(0, 2**20, 2**40, 1), 1.0))
    monkeypatch.setattr(capacity, "QUIET_BYTES", 0)
    result = CliRunner().invoke(main, [
        "run", "transpose-sum", "--cpu", "--n-workers", "1", "--dashboard-address", "", "--json", "--no-progress",
        "--param", "size=600x600", "--param", "chunks=200x200",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    said = [line for line in result.stderr.splitlines() if "go to the spill disk" in line]
    assert len(said) == 1 and said == report["disk_traffic"], result.stderr
    assert said[0].startswith("compute past device + host tier: ")
    assert "how long is not known: no worker has measured its spill disk's rate (1 worker)" in said[0]
    # stdout holds the report alone
    assert not [line for line in result.stdout.splitlines()[:-1] if "go to the spill disk" in line]
