"""``spillway bench --zarr``: a real CPU cluster writes and reads a Zarr store against the
disk ceilings of the same run; the targets, refusals and files; on the GPU host the same
command with CuPy chunks."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from service.bench import zarr_io as bench
from service.cli import main
from service.gpus import Inventory
from service.options import Options


@pytest.mark.parametrize("args, fragment", [
    (["--only", "W1", "--no-baseline"], "zarr: measures Zarr I/O, not the workloads; --only, --no-baseline does not "
                                        "apply"),
    (["--link-sweep"], "zarr: measures Zarr I/O, not the workloads; --link-sweep does not apply"),
    (["--sizes", "full"], "sizes: the full store (93.17 GiB) is read whole into the workers' memory, more than 30%"),
    (["--label", "a b"], "label: 'a b' must be"),
])
def test_bad_input_fails_with_one_line_before_starting(args, fragment, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "host_memory_bytes", lambda: 24 * 2**30)
    monkeypatch.setattr(bench.shutil, "disk_usage", lambda path: type("U", (), {"free": 10**15})())
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, ["bench", "--zarr", "--cpu", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output.replace("\n", " ")
    assert time.perf_counter() - t0 < 10
    assert not list(tmp_path.iterdir())


def test_a_store_larger_than_the_free_disk_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.shutil, "disk_usage", lambda path: type("U", (), {"free": 10**6})())
    with pytest.raises(Exception, match=r"sizes: the tiny store takes 58.55 MiB, more than 90% of the 0.95 MiB free"):
        bench.prepare_zarr(Options.resolve(cpu=True, local_directory=str(tmp_path)),
                           inventory=Inventory(gpus=(), reason="test"))


def test_targets_are_judged_on_gpus_only():
    summary = {"cached_read": {"gbps": 12.0}, "cold_read": {"ratio_to_ceiling": 0.65}}
    gpu = bench.targets(summary, "gpu")
    assert [t["met"] for t in gpu] == [True, False]
    assert [t["met"] for t in bench.targets(summary, "cpu")] == [None, None]
    assert bench.ceiling_of("cached_read", "gpu", {"h2d_pinned": 50.0}, 2) == ("h2d_pinned x 2 GPUs", 100.0)
    assert bench.ceiling_of("cold_read", "cpu", {"disk_read": 3.0}, 0) == ("disk_read", 3.0)


def test_the_fingerprint_sees_every_bit():
    import dask.array as da

    x = np.random.default_rng(0).random((40, 30)).astype(np.float32)
    y = x.copy()
    y.view(np.uint32)[17, 3] ^= 1  # the last bit of one element
    fx = bench.fingerprint(da.from_array(x, chunks=(7, 11))).compute(scheduler="sync")
    assert fx == bench.fingerprint(da.from_array(x, chunks=(40, 30))).compute(scheduler="sync")
    assert fx != bench.fingerprint(da.from_array(y, chunks=(7, 11))).compute(scheduler="sync")


@pytest.mark.timeout(300)
def test_zarr_bench_on_cpu_workers_writes_reads_and_reports(tmp_path):
    from matplotlib import image

    out = tmp_path / "results"
    result = CliRunner().invoke(main, ["bench", "--zarr", "--cpu", "--n-workers", "2", "--sizes", "tiny",
                                       "--local-directory", str(tmp_path), "--label", "t", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (stem,) = {p.stem for p in out.iterdir()}
    assert stem.startswith("cpu-") and stem.endswith("-zarr-t")
    data = json.loads((out / f"{stem}.json").read_text())
    assert data["bytes"] == 4 * 365 * 73 * 144 * 4 and data["chunks"] == [365, 73, 144]
    assert data["cluster"] == {"kind": "cpu", "n_workers": 2}
    assert data["ceilings"]["disk_write"] > 0 and data["ceilings"]["disk_read"] > 0
    for name, ceiling in (("write", "disk_write"), ("cold_read", "disk_read"), ("cached_read", "host_copy")):
        m = data[name]
        assert m["bits_equal"] and m["gbps"] > 0 and m["ceiling"] == ceiling
        assert m["ratio_to_ceiling"] == pytest.approx(m["gbps"] / data["ceilings"][ceiling])
        assert m["gbps"] == pytest.approx(data["bytes"] / m["seconds"] / 1e9)
    assert len(data["cold_read"]["runs"]) == len(data["cached_read"]["runs"]) == 3
    assert [t["met"] for t in data["targets"]] == [None, None]
    md = (out / f"{stem}.md").read_text()
    assert "| cold read |" in md and "## Targets" in md and "not judged (CPU workers)" in md
    assert image.imread(out / f"{stem}.png").shape[0] > 100
    assert "cached read" in result.output and "target: cold read >= 70%" in result.output
    # the store is gone (the workers' scratch space stays in --local-directory)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("spillway-zarr-bench-")]


@pytest.mark.gpu
@pytest.mark.timeout(1200)
def test_zarr_bench_on_the_gpus(tmp_path, capsys):
    """The small store through KvikIO on every GPU: bits equal, and the targets printed."""
    out = tmp_path / "results"
    result = CliRunner().invoke(main, ["bench", "--zarr", "--sizes", "small", "--local-directory", str(tmp_path),
                                       "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (stem,) = {p.stem for p in out.iterdir()}
    data = json.loads((out / f"{stem}.json").read_text())
    with capsys.disabled():
        print("\n" + result.output, flush=True)
    assert data["cluster"]["kind"] == "gpu"
    assert all(data[n]["bits_equal"] for n in bench.MEASURES)
    assert any(p.startswith("KvikIO") for p in data["io_path"]), data["io_path"]
