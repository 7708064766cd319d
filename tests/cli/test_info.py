"""`spillway info` and the bench's machine description: one NVLink topology, rendered as
``nvidia-smi topo -m`` prints it, from stand-in NVML hosts."""

from __future__ import annotations

import pytest

from spillway.options import gpus
from spillway.cli import info
from spillway.options.gpus import topology_lines
from spillway_bench import report

from ..options.test_gpus import FakeNVML, FakeSwitchNVML


@pytest.fixture
def nvml_host(monkeypatch):
    """Point ``spillway info`` at a stand-in NVML; returns the inventory it reads."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def use(fake):
        inventory = gpus._read(fake)
        monkeypatch.setattr(info, "discover", lambda: inventory)
        return inventory

    return use


def _matrix(text: str) -> list[list[str]]:
    """The cells of the NVLink matrix in ``text``, one row per GPU."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("NVLink links"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("GPU"):
            break
        rows.append(line.split()[1:])
    return rows


def test_info_shows_nv18_between_every_pair_of_an_nvswitch_host(nvml_host):
    nvml_host(FakeSwitchNVML(count=4))
    data = info.collect()
    assert data["gpus"][0]["nvlinks"] == {"1": 18, "2": 18, "3": 18}
    assert data["gpus"][0]["nvswitch_links"] == 18
    text = info.format_info(data)
    assert "through NVSwitch: 18 links per GPU to the switch" in text
    assert _matrix(text) == [["-" if i == j else "NV18" for j in range(4)] for i in range(4)]
    assert "NV0" not in text


def test_info_keeps_direct_links_of_a_two_gpu_host(nvml_host):
    nvml_host(FakeNVML(lambda i: f"0000:00:0{7 - i}.0"))
    text = info.format_info(info.collect())
    assert _matrix(text) == [["-", "NV18"], ["NV18", "-"]]
    assert "NVSwitch" not in text


def test_bench_machine_description_shows_the_topology_info_shows(nvml_host):
    inventory = nvml_host(FakeSwitchNVML(count=4))
    machine = report.describe_machine(inventory, "gpu")
    data = info.collect()
    assert [{k: g[k] for k in ("nvlinks", "nvswitch_links")} for g in machine["gpus"]] == [
        {k: g[k] for k in ("nvlinks", "nvswitch_links")} for g in data["gpus"]]
    results = {"machine": machine, "started": "s", "finished": "f", "sizes": "tiny", "runs": 3,
               "clusters": {}, "ceilings": {}, "ceilings_skipped": {}, "ceiling_bytes": 1,
               "workloads": [], "targets": []}
    md = report.markdown(results)
    assert _matrix(md) == _matrix(info.format_info(data))
    assert topology_lines(machine["gpus"])[0] in md


def test_topology_of_older_results_files_without_switch_counts():
    # bench JSON written before switch links were recorded has nvlinks alone
    old = [{"index": 0, "nvlinks": {"1": 18}}, {"index": 1, "nvlinks": {"0": 18}}]
    lines = topology_lines(old)
    assert lines[0] == "NVLink links (rows to columns):"
    assert topology_lines(old[:1]) == []


def test_info_says_how_gpu_workers_move_zarr_chunks(nvml_host):
    nvml_host(FakeNVML(lambda i: f"0000:00:0{7 - i}.0"))
    data = info.collect()
    data["stack"]["kvikio"] = None
    assert "zarr chunks on GPU workers: read on the host and copied (kvikio missing" in info.format_info(data)
    data["stack"]["kvikio"] = "26.10.0"
    assert "zarr chunks on GPU workers: KvikIO 26.10.0 (whole chunk files" in info.format_info(data)
    assert info.zarr_io_line(data["stack"], has_gpus=False) is None
