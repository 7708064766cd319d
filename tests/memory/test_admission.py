"""Admission by projected footprint."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from spillway.cli import main
from spillway.options.errors import AdmissionError
from spillway.memory.admission import Capacity, admit
from spillway.workflows.workflow import Footprint

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


# --- the disk: the free space of the filesystem the workers spill to, less a reserve


def test_disk_reserve_is_a_twentieth_between_1_and_50_gib():
    from spillway.memory.admission import disk_reserve

    GiB = 2**30
    assert disk_reserve(10 * GiB) == GiB
    assert disk_reserve(64 * 10**9) == 64 * 10**9 // 20
    assert disk_reserve(10**13) == 50 * GiB


class _Worker:
    def __init__(self, directory, memory_limit):
        self.local_directory = str(directory)
        self.data = {}
        self.memory_manager = type("M", (), {"memory_limit": memory_limit})()


def test_a_worker_counts_its_spill_filesystem_less_the_reserve(tmp_path):
    import os
    import shutil

    from spillway.memory.admission import disk_reserve, worker_capacity

    cap = worker_capacity(_Worker(tmp_path, 3 * GB))
    usage = shutil.disk_usage(tmp_path)
    assert cap["host"] == 3 * GB and cap["device"] == 0
    assert cap["disk_directory"] == str(tmp_path) and cap["filesystem"] == os.stat(tmp_path).st_dev
    assert cap["disk_reserve"] == disk_reserve(usage.total)
    # the free space moves a little between two readings
    assert abs(cap["disk"] - (usage.free - disk_reserve(usage.total))) < 64 * 2**20
    assert cap["disk"] == max(0, cap["disk_free"] - cap["disk_reserve"])


def test_workers_spilling_to_one_filesystem_count_it_once():
    from spillway.memory.admission import cluster_capacity

    def worker(fs, disk):
        return {"device": 10 * GB, "host": 20 * GB, "disk": disk, "disk_free": disk + GB, "disk_reserve": GB,
                "filesystem": fs}

    class Client:
        def run(self, func):
            return {"tcp://10.0.0.1:1": worker(7, 100 * GB), "tcp://10.0.0.1:2": worker(7, 100 * GB),
                    "tcp://10.0.0.1:3": worker(8, 30 * GB), "tcp://10.0.0.2:1": worker(7, 100 * GB)}

    cap = cluster_capacity(Client())
    assert (cap.device_bytes, cap.host_bytes, cap.n_workers) == (40 * GB, 80 * GB, 4)
    assert cap.disk_bytes == 230 * GB  # host 1: filesystems 7 and 8; host 2: its own 7
    assert cap.disk_free_bytes == 233 * GB and cap.disk_reserve_bytes == 3 * GB


def test_refusal_names_footprint_each_tier_and_the_limit():
    capacity = Capacity(80 * GB, 111 * GB, 40 * GB, 1, disk_free_bytes=43 * GB, disk_reserve_bytes=3 * GB)
    with pytest.raises(AdmissionError) as e:
        admit("svd", Footprint(total_bytes=240 * GB, per_worker_bytes=240 * GB), capacity)
    assert str(e.value) == ("svd: projected footprint 223.52 GiB exceeds the cluster's device + host + disk capacity "
                            "215.14 GiB (device 74.51 GiB + host tier 103.38 GiB + disk 37.25 GiB (40.05 GiB free "
                            "less a reserve of 2.79 GiB), 1 worker)")
    # what fits device, host tier and disk together runs, spilling
    assert not admit("svd", Footprint(total_bytes=230 * GB, per_worker_bytes=230 * GB), capacity).fits_device


def test_a_real_cluster_counts_the_disk_of_its_local_directory(tmp_path):
    """Refused on CPU workers whose host tier is 1 GB: the disk of the local directory is
    in the numbers, less its reserve, and nothing was computed."""
    import re
    import shutil

    from spillway.memory.admission import disk_reserve
    from spillway.options.sizes import format_bytes

    usage = shutil.disk_usage(tmp_path)
    side = int((2 * usage.free / 8) ** 0.5) + 1  # an input twice the free disk
    result = CliRunner().invoke(
        main, ["run", "transpose-sum", "--cpu", "--n-workers", "1", "--memory-limit", "1GB", "--dashboard-address",
               "", "--local-directory", str(tmp_path), "--param", f"size={side}x{side}"])
    assert result.exit_code == 3, result.output
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert re.search(r"host tier [\d.]+ \w+ \+ disk [\d.]+ \w+ \([\d.]+ \w+ free less a reserve of "
                     + re.escape(format_bytes(disk_reserve(usage.total))) + r"\), 1 worker\)$", last), last


def test_disk_traffic_is_an_even_share_at_the_slowest_worker_s_rates():
    from spillway.memory.admission import disk_traffic

    def worker(write, read, source="probe"):
        return {"disk_write_rate": write, "disk_read_rate": read, "disk_write_from": source,
                "disk_read_from": source}

    reports = {"tcp://a:1": worker(2 * GB, 4 * GB), "tcp://a:2": worker(GB, 2 * GB, "spills"),
               "tcp://b:1": worker(0.0, 0.0, None)}  # no rates yet: its share, not its time
    traffic = disk_traffic(30 * GB, reports)
    assert traffic.share == 10 * GB and traffic.n_workers == 3
    assert traffic.seconds == pytest.approx(10 + 5)  # the second: 10 GB at 1 GB/s, 10 GB at 2 GB/s
    assert (traffic.write_rate, traffic.read_rate, traffic.rates_from) == (GB, 2 * GB, "spills")
    unknown = disk_traffic(GB, {"tcp://b:1": worker(0.0, 0.0, None)})
    assert unknown.seconds is None and unknown.nbytes == GB

