"""``spillway bench --zarr``: a real CPU cluster writes and reads a Zarr store against the
disk ceilings of the same run; the targets, refusals and files; on the GPU host the same
command with CuPy chunks."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from click.testing import CliRunner

from spillway_bench.zarr import measure as zarr_measure, prepare as zarr_prepare, run as zarr_run
from spillway.cli import main
from spillway.options.gpus import Inventory
from spillway.options.settings import Options


@pytest.mark.parametrize("args, fragment", [
    (["--only", "W1", "--no-baseline"], "zarr: measures Zarr I/O, not the workloads; --only, --no-baseline does not "
                                        "apply"),
    (["--link-sweep"], "zarr: measures Zarr I/O, not the workloads; --link-sweep does not apply"),
    (["--sizes", "full"], "sizes: the full store (93.17 GiB) is read whole into the workers' memory, more than 30%"),
    (["--label", "a b"], "label: 'a b' must be"),
])
def test_bad_input_fails_with_one_line_before_starting(args, fragment, tmp_path, monkeypatch):
    monkeypatch.setattr(zarr_prepare, "host_total", lambda: 24 * 2**30)
    monkeypatch.setattr(zarr_prepare.shutil, "disk_usage", lambda path: type("U", (), {"free": 10**15})())
    result = CliRunner().invoke(main, ["bench", "--zarr", "--cpu", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output.replace("\n", " ")
    assert not list(tmp_path.iterdir())


def test_a_store_larger_than_the_free_disk_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(zarr_prepare.shutil, "disk_usage", lambda path: type("U", (), {"free": 10**6})())
    with pytest.raises(Exception, match=r"sizes: the tiny stores take up to 117.09 MiB, more than 90% of the 0.95 MiB "
                                        r"free"):
        zarr_prepare.prepare_zarr(Options.resolve(cpu=True, local_directory=str(tmp_path)),
                           inventory=Inventory(gpus=(), reason="test"))


def _store(cached, cold, decode):
    out = {"cached_read": {"gbps": cached}, "cold_read": {"ratio_to_ceiling": cold}}
    if decode != "none":
        out["decode"] = {"gpu": {"gbps_per_worker": decode}}
    return out


def test_targets_are_judged_on_gpus_only():
    stores = {"uncompressed": _store(12.0, 0.65, decode="none"), "zstd": _store(9.0, 0.9, decode=6.0)}
    gpu = zarr_run.targets(stores, "gpu")
    assert [(t["store"], t["met"]) for t in gpu] == [("uncompressed", True), ("uncompressed", False),
                                                     ("zstd", False), ("zstd", True), ("zstd", True)]
    assert "decoded on the GPU >= 5 GB/s" in gpu[-1]["target"]
    assert zarr_run.targets({"zstd": _store(9.0, 0.9, decode=None)}, "gpu")[-1]["met"] is False
    assert all(t["met"] is None for t in zarr_run.targets(stores, "cpu"))
    assert zarr_run.ceiling_of("cached_read", "gpu", {"h2d_pinned": 50.0}, 2) == ("h2d_pinned x 2 GPUs", 100.0)
    assert zarr_run.ceiling_of("cold_read", "cpu", {"disk_read": 3.0}, 0) == ("disk_read", 3.0)


def test_a_compressed_store_is_judged_on_the_bytes_that_crossed_the_disk():
    runs = {"runs": [{"seconds": 2.0, "bits_equal": True}]}
    measured = {"zstd": {"write": runs, "cold_read": runs, "cached_read": runs, "stored_bytes": 10**9,
                         "decoded": {"gpu": {"bytes": 4 * 10**9, "frames": 10, "seconds": 0.5, "workers": 1},
                                     "host": {"bytes": 0, "frames": 0, "seconds": 0.0, "workers": 0}}}}
    s = zarr_run.summarize(measured, nbytes=4 * 10**9, kind="gpu", gbps={"disk_read": 1.0, "disk_write": 1.0,
                                                                      "h2d_pinned": 20.0}, n_gpus=1)["zstd"]
    assert s["ratio"] == 4.0
    assert s["cold_read"]["gbps"] == 2.0 and s["cold_read"]["stored_gbps"] == 0.5
    assert s["cold_read"]["ratio_to_ceiling"] == 0.5  # 0.5 GB/s of files against 1 GB/s of disk
    assert s["cached_read"]["ratio_to_ceiling"] == 0.1  # array bytes against the host -> GPU copy
    assert s["decode"]["gpu"]["gbps_per_worker"] == 8.0


def test_the_fingerprint_sees_every_bit():
    import dask.array as da

    x = np.random.default_rng(0).random((40, 30)).astype(np.float32)
    y = x.copy()
    y.view(np.uint32)[17, 3] ^= 1  # the last bit of one element
    fx = zarr_measure.fingerprint(da.from_array(x, chunks=(7, 11))).compute(scheduler="sync")
    assert fx == zarr_measure.fingerprint(da.from_array(x, chunks=(40, 30))).compute(scheduler="sync")
    assert fx != zarr_measure.fingerprint(da.from_array(y, chunks=(7, 11))).compute(scheduler="sync")


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
    assert data["zstd_inner_chunks"] == [1, 73, 144]
    assert data["cluster"] == {"kind": "cpu", "n_workers": 2}
    assert data["ceilings"]["disk_write"] > 0 and data["ceilings"]["disk_read"] > 0
    assert set(data["stores"]) == {"uncompressed", "zstd"}
    for store in data["stores"].values():
        for name, ceiling in (("write", "disk_write"), ("cold_read", "disk_read"), ("cached_read", "host_copy")):
            m = store[name]
            assert m["bits_equal"] and m["gbps"] > 0 and m["ceiling"] == ceiling
            assert m["gbps"] == pytest.approx(data["bytes"] / m["seconds"] / 1e9)
        assert len(store["cold_read"]["runs"]) == len(store["cached_read"]["runs"]) == 3
    raw, zstd = data["stores"]["uncompressed"], data["stores"]["zstd"]
    assert 0 < raw["stored_bytes"] - data["bytes"] < 4096  # every chunk a file of its bytes, and zarr.json
    assert 1.2 < zstd["ratio"] < 20  # values to 0.001 compress
    # CPU workers read with da.from_zarr: zarr decodes, nothing on a GPU
    assert zstd["decode"]["gpu"]["frames"] == 0 and zstd["decode"]["gpu"]["gbps_per_worker"] is None
    assert all(t["met"] is None for t in data["targets"]) and len(data["targets"]) == 5
    md = (out / f"{stem}.md").read_text()
    assert "| zstd | cold read |" in md and "## Targets" in md and "not judged (CPU workers)" in md
    assert "zstd: " in md and ", ratio " in md
    assert image.imread(out / f"{stem}.png").shape[0] > 100
    assert "cached read" in result.output and "target: zstd: cold read >= 70%" in result.output
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
    assert data["cluster"]["kind"] == "gpu" and data["machine"]["gpus"]
    assert all(s[n]["bits_equal"] for s in data["stores"].values() for n in zarr_prepare.MEASURES)
    assert any(p.startswith("KvikIO") for p in data["io_path"]), data["io_path"]
    decoded = data["stores"]["zstd"]["decode"]
    frames = 6 * 8 * 365 * 7  # 7 bands a day
    if importlib.util.find_spec("nvidia.nvcomp") is not None:
        # every zstd frame was decoded on the GPU, none on the host
        assert decoded["gpu"]["frames"] == frames and decoded["host"]["frames"] == 0
    else:
        # without nvCOMP the reader says so and zarr decodes every frame on the host, to the same bits
        assert decoded["gpu"]["frames"] == 0

