"""Admission by projected footprint."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from spillway.service.cli import main
from spillway.service.errors import AdmissionError
from spillway.service.memory.admission import Capacity, admit
from spillway.workflows.registry import Footprint

GB = 10**9


def test_fits_device():
    d = admit("w", Footprint(total_bytes=10 * GB, per_worker_bytes=5 * GB), Capacity(20 * GB, 100 * GB, 500 * GB, 2))
    assert d.fits_device and d.note == "fits in device memory"


def test_fits_only_with_spilling():
    d = admit("w", Footprint(total_bytes=60 * GB, per_worker_bytes=30 * GB), Capacity(20 * GB, 100 * GB, 500 * GB, 2))
    assert not d.fits_device and "runs with spilling" in d.note


def test_refused_with_both_numbers():
    with pytest.raises(AdmissionError) as e:
        admit("transpose-sum", Footprint(total_bytes=700 * GB, per_worker_bytes=350 * GB),
              Capacity(20 * GB, 100 * GB, 500 * GB, 2))
    msg = str(e.value)
    assert "projected footprint 651.93 GiB exceeds" in msg and "capacity 577.42 GiB" in msg
    assert "\n" not in msg


def test_cli_refuses_before_computing():
    result = CliRunner().invoke(
        main,
        ["run", "transpose-sum", "--cpu", "--n-workers", "1", "--param", "size=2000000x2000000",
         "--memory-limit", "1GB", "--dashboard-address", ""],
    )
    assert result.exit_code == 3, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("spillway: error: transpose-sum: projected footprint 29.10 TiB exceeds")
