"""``spillway bench-scaling``: the scaled sizes, the workloads built at them against NumPy,
the combined report, and a real study run on CPU workers at 1 and 2 workers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from reference_inputs import uniform_numpy
from spillway_bench import scaling, workloads
from spillway_bench.scaling import BASE_WORKERS, STUDY
from spillway.cli import main
from spillway.options.errors import ParamError
from spillway.workflows import random
from spillway.workflows.params import Target

SCALES = ("tiny", "small", "full")
COUNTS = (1, 2, 3, 4, 6, 8, 16)


def rel_error(computed, reference) -> float:
    c = np.asarray(computed, dtype=np.asarray(reference).dtype)
    return float(np.linalg.norm((c - reference).ravel()) / np.linalg.norm(np.asarray(reference).ravel()))


# --- sizes


@pytest.mark.parametrize("name", STUDY)
@pytest.mark.parametrize("scale", SCALES)
def test_weak_sizes_keep_chunks_and_data_per_worker(name, scale):
    w = workloads.WORKLOADS[name]
    base = w.params(scale)
    per_worker = workloads.data_bytes(base) / BASE_WORKERS
    for n in COUNTS:
        p = scaling.weak_params(w, scale, n)
        # chunk shapes are the workload's, and every axis is a whole number of them
        for key in ("chunks", "to_chunks", "out_chunks"):
            assert p.get(key) == base.get(key)
            if p.get(key):
                assert all(s % c == 0 for s, c in zip(p["shape"], p[key])), (n, key, p["shape"])
        assert p["dtype"] == base["dtype"] and p.get("inputs") == base.get("inputs")
        if tuple(base["out_shape"]) == tuple(base["shape"]):
            assert tuple(p["out_shape"]) == tuple(p["shape"])
        else:
            assert tuple(p["out_shape"]) == tuple(base["out_shape"])
        # the total data is the 2-worker data per worker times n, within one growth row
        # (W3 grows in whole column chunks of its full height, so below 2 workers it cannot shrink)
        if not (name == "W3" and n < BASE_WORKERS):
            assert abs(workloads.data_bytes(p) - per_worker * n) <= scaling.row_bytes(w, p), (n, p["shape"])
        assert all(s // c >= 1 for s, c in zip(p["shape"], p["chunks"]))
    assert scaling.weak_params(w, scale, BASE_WORKERS)["shape"] == tuple(base["shape"])


@pytest.mark.parametrize("name, scale, n, shape", [
    ("W1", "full", 4, (60000, 60000)),   # 16 chunks * 2 = 32 -> 6^2 = 36 chunks
    ("W1", "full", 8, (80000, 80000)),   # 64 chunks, exactly 4x
    ("W1", "small", 8, (60000, 60000)),
    ("W2", "full", 8, (40000, 40000)),
    ("B2", "full", 4, (110000, 110000)),  # 128 chunks -> 11^2 = 121
    ("B2", "full", 8, (160000, 160000)),
    ("W3", "full", 4, (160000, 80000)),  # rows grow in whole output columns of 80000
    ("W3", "full", 8, (320000, 80000)),
    ("W4", "full", 8, (40000, 160000)),  # axis 0 stays one chunk for the fft
    ("W5", "small", 8, (4096, 1024, 1024)),
    ("W5", "tiny", 1, (32, 64, 64)),
])
def test_weak_shapes(name, scale, n, shape):
    assert scaling.weak_params(workloads.WORKLOADS[name], scale, n)["shape"] == shape


def test_weak_exact_when_the_worker_count_is_a_power_of_four_times_the_base():
    for name in STUDY:
        w = workloads.WORKLOADS[name]
        for scale in SCALES:
            base = workloads.data_bytes(w.params(scale))
            assert workloads.data_bytes(scaling.weak_params(w, scale, 8)) == 4 * base
            assert workloads.data_bytes(scaling.weak_params(w, scale, 32)) == 16 * base


@pytest.mark.parametrize("name", STUDY)
def test_strong_sizes_are_the_workloads(name):
    w = workloads.WORKLOADS[name]
    for scale in SCALES:
        for n in COUNTS:
            assert scaling.strong_params(w, scale, n) == dict(w.params(scale))


def test_bad_requests_fail_with_one_line():
    w1 = workloads.WORKLOADS["W1"]
    with pytest.raises(ParamError, match="n-workers: 0 must be >= 1"):
        scaling.weak_params(w1, "full", 0)
    with pytest.raises(ParamError, match="mode: 'sideways' is not one of weak, strong"):
        scaling.scaled_params(w1, "full", "sideways", 2)
    with pytest.raises(ParamError, match="only: B1 is not part of the scaling study: sized to exceed"):
        scaling.study("W1,B1")
    with pytest.raises(ParamError, match="only: B3 is not part of the scaling study"):
        scaling.study("b3")
    with pytest.raises(ParamError, match=r"only: 'W9' is not a workload of the scaling study \(known: W1"):
        scaling.study("W9")
    assert scaling.study(None) == list(STUDY)
    assert scaling.study("b2, w1") == ["W1", "B2"]
    with pytest.raises(ParamError, match="not part of the scaling study"):
        scaling.weak_params(workloads.WORKLOADS["B1"], "full", 4)


def test_scaled_workload_is_what_the_harness_sees():
    w = scaling.scaled(workloads.WORKLOADS["W1"], "full", "weak", 8)
    assert list(w.sizes) == ["full"]
    assert w.describe("full") == "transpose-sum (x + x.T).sum() 80000x80000 float64, chunks 10000x10000"
    assert w.input_bytes("full") == 4 * workloads.WORKLOADS["W1"].input_bytes("full")
    assert w.chunk_bytes("full") == workloads.WORKLOADS["W1"].chunk_bytes("full")
    with pytest.raises(ParamError):
        w.params("small")
    # the catalogue itself is untouched
    assert workloads.WORKLOADS["W1"].params("full")["shape"] == (40000, 40000)


@pytest.mark.parametrize("name", ["W1", "W2", "W3", "W4", "W5"])
def test_scaled_workloads_build_and_match_numpy(name):
    w = scaling.scaled(workloads.WORKLOADS[name], "tiny", "weak", 4)
    p = w.params("tiny")
    built = w.build("tiny", Target(kind="cpu", n_workers=4), seed=5)
    result = built.result
    assert tuple(result.shape) == tuple(p["out_shape"])
    if name in ("W3", "W4"):
        assert tuple(result.chunksize) == tuple(p["to_chunks"])
    elif name != "W1":
        assert tuple(result.chunksize) == tuple(p["chunks"])
    computed = result.compute(scheduler="sync")
    if name == "W4":
        loc = tuple((0, s) for s in p["shape"])
        x = (random.uniform_block(5, 0, p["shape"], loc, "float64", "numpy")
             + 1j * random.uniform_block(5, 1, p["shape"], loc, "float64", "numpy"))
        reference = np.fft.fft(x, axis=0)
    elif name == "W5":
        # the registered stencil workflow takes the non-cubic shape; its boundary is periodic
        assert built.source == "workflow stencil"
        a = uniform_numpy(p["shape"], seed=5, dtype="float32").astype(np.float64)
        reference = -6 * a
        for axis in range(3):
            for shift in (-1, 1):
                reference += np.roll(a, shift, axis=axis)
    else:
        a = uniform_numpy(p["shape"], seed=5, dtype="float64")
        reference = {"W1": lambda: (a + a.T).sum(), "W3": lambda: a,
                     "W2": lambda: a @ uniform_numpy(p["shape"], seed=5, stream=1, dtype="float64")}[name]()
    assert rel_error(computed, reference) <= (1e-5 if p["dtype"] == "float32" else 1e-10)


# --- combining runs


def _run_file(tmp_path, n, *, mode="weak", modes=None, sizes="small", gpu="NVIDIA H200", times=None,
              name=None):
    machine = {"name": f"{n}x-nvidia-h200", "workers": "gpu", "gpus": [{"name": gpu}] * n}
    times = times or {}
    data = {
        "machine": machine, "sizes": sizes,
        "scaling": {"mode": mode, "modes": modes or scaling.modes_at(n, mode), "workers": n,
                    "kind": scaling.machine_kind(machine), "sizes": sizes,
                    "shapes": {k: [n * 1000, 1000] for k in times},
                    "data_bytes_per_worker": {k: 8e6 for k in times}},
        "workloads": [{"name": k, "spillway_s": t, "transfer_gbps_p25": 10.0 * n,
                       "transfer_gbps_median": 20.0 * n, "transfer_gbps_p75": 30.0 * n, "bytes_moved": 10**9 * n,
                       "spillway": {"error": None if t else "TimeoutError: run 1"}} for k, t in times.items()],
    }
    path = tmp_path / (name or f"run-{mode}-n{n}.json")
    path.write_text(json.dumps(data))
    return path


def test_efficiency_weak_and_strong():
    assert scaling.efficiency("weak", 2.0, 2, 2.5, 8) == pytest.approx(0.8)
    assert scaling.efficiency("strong", 2.0, 2, 1.0, 8) == pytest.approx(0.5)
    assert scaling.efficiency("strong", 2.0, 2, 0.5, 8) == pytest.approx(1.0)
    assert scaling.efficiency("weak", None, 2, 1.0, 8) is None


def test_report_rows_per_workload(tmp_path):
    files = [_run_file(tmp_path, n, mode="strong", times={"W1": t, "W5": 2 * t})
             for n, t in ((8, 0.5), (2, 1.6), (4, 0.8))]
    mode, runs = scaling.load_runs(files)
    assert mode == "strong" and [r["scaling"]["workers"] for r in runs] == [2, 4, 8]
    combined = scaling.combine(mode, runs)
    rows = combined["workloads"]["W1"]
    assert [r["workers"] for r in rows] == [2, 4, 8]
    assert [r["relative_time"] for r in rows] == pytest.approx([1.0, 0.5, 0.3125])
    assert [r["efficiency"] for r in rows] == pytest.approx([1.0, 1.0, 1.6 * 2 / (0.5 * 8)])
    assert rows[2]["transfer_gbps_median"] == 160.0 and rows[2]["bytes_moved"] == 8 * 10**9
    text = scaling.text_table(combined)
    assert "W1 (strong scaling)" in text and "W5 (strong scaling)" in text
    assert text.splitlines()[1].split()[:4] == ["workers", "shape", "time", "s"]
    paths = scaling.write_report(combined, tmp_path / "out")
    assert paths["md"].name == "scaling-gpu-nvidia-h200-small-strong-workers-2-4-8.md"
    assert paths["png"].stat().st_size > 10_000
    md = paths["md"].read_text()
    assert "| 8 | 8000x1000 | 0.500 | 0.31x | 0.80 | 160.0 | 80.0 / 240.0 | 7.45 GiB |" in md
    assert json.loads(paths["json"].read_text())["workers"] == [2, 4, 8]


def test_report_shows_a_failed_run(tmp_path):
    files = [_run_file(tmp_path, 2, times={"W1": 1.0}), _run_file(tmp_path, 4, times={"W1": None})]
    combined = scaling.combine(*scaling.load_runs(files))
    row = combined["workloads"]["W1"][1]
    assert row["efficiency"] is None and "failed: TimeoutError" in scaling.text_table(combined)


def test_a_two_worker_run_serves_both_modes(tmp_path):
    files = [_run_file(tmp_path, 2, mode="weak", times={"W1": 1.0}),
             _run_file(tmp_path, 8, mode="strong", times={"W1": 0.5})]
    mode, _ = scaling.load_runs(files)
    assert mode == "strong"


@pytest.mark.parametrize("other, fragment", [
    ({"mode": "strong"}, "mode: "),
    ({"sizes": "full"}, "sizes: "),
    ({"gpu": "NVIDIA H100 80GB HBM3"}, "machine kind: "),
])
def test_report_refuses_mixed_runs(tmp_path, other, fragment):
    a = _run_file(tmp_path, 4, times={"W1": 1.0})
    b = _run_file(tmp_path, 8, times={"W1": 1.0}, name="other.json", **other)
    result = CliRunner().invoke(main, ["bench-scaling", "report", str(a), str(b)])
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"spillway: error: {fragment}"), result.output


def test_report_refuses_two_runs_of_one_count_and_foreign_files(tmp_path):
    a = _run_file(tmp_path, 4, times={"W1": 1.0})
    b = _run_file(tmp_path, 4, times={"W1": 1.1}, name="again.json")
    with pytest.raises(ParamError, match="files: 2 runs on 4 workers"):
        scaling.load_runs([a, b])
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"workloads": []}))
    with pytest.raises(ParamError, match="is not a bench-scaling results file"):
        scaling.load_runs([plain])


@pytest.mark.parametrize("args, fragment", [
    (["--mode", "weak", "--only", "B3"], "only: B3 is not part of the scaling study"),
    # the scaled sizes are checked, not only the workload's: W1 tiny on 100000 workers is 1.45 TiB
    (["--mode", "weak", "--sizes", "tiny", "--only", "W1", "--n-workers", "100000"],
     "sizes: W1 at tiny needs 1.45 TiB of input"),
    (["--mode", "weak", "--n-workers", "0"], "n-workers: 0 must be >= 1"),
])
def test_run_refuses_bad_input_before_starting(tmp_path, args, fragment):
    result = CliRunner().invoke(main, ["bench-scaling", "run", "--cpu", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0], result.output
    assert not list(tmp_path.iterdir())


# --- a real study on CPU workers (CI)


@pytest.mark.slow
def test_cpu_weak_study_at_one_and_two_workers_then_report(tmp_path):
    for n in (1, 2):
        result = CliRunner().invoke(main, ["bench-scaling", "run", "--cpu", "--mode", "weak", "--sizes", "tiny",
                                           "--only", "W1", "--n-workers", str(n), "--out", str(tmp_path)],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
    files = sorted(tmp_path.glob("*.json"))
    assert [f.stem.rsplit("-", 2)[1:] for f in files] == [["weak", "n1"], ["weak", "n2"]]
    for f, n, shape in zip(files, (1, 2), ([1500, 1500], [2000, 2000])):
        data = json.loads(f.read_text())
        assert data["scaling"]["workers"] == n == data["clusters"]["spillway"]["n_workers"]
        assert data["scaling"]["shapes"] == {"W1": shape}
        assert data["baseline_run"] is False and "baseline" not in data["clusters"]
        assert f.with_suffix(".log").exists() and f.with_suffix(".png").exists()
    assert scaling.load_runs(files)[0] == "weak"

    result = CliRunner().invoke(main, ["bench-scaling", "report", *map(str, files), "--out", str(tmp_path / "r")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "W1 (weak scaling)"
    rows = [l.split() for l in lines[2:4]]
    assert [r[:2] for r in rows] == [["1", "1500x1500"], ["2", "2000x2000"]]
    efficiencies = [float(r[4]) for r in rows]
    assert efficiencies[0] == 1.0 and all(0 < e <= 2 for e in efficiencies)
    # two workers move half of x for x.T; one worker moves nothing
    assert rows[0][5] == "—" and float(rows[1][5]) > 0
    (png,) = (tmp_path / "r").glob("*.png")
    assert png.stat().st_size > 10_000
    assert "| 2 | 2000x2000 |" in next((tmp_path / "r").glob("*.md")).read_text()


@pytest.mark.slow
def test_both_modes_share_the_budget_and_a_stopped_study_keeps_what_it_finished(tmp_path):
    # on 1 worker the modes differ: weak runs its first part (W1), then the budget of 0 s
    # stops B2 and the strong run; the file written still reads back
    result = CliRunner().invoke(main, ["bench-scaling", "run", "--cpu", "--n-workers", "1", "--mode", "both",
                                       "--sizes", "tiny", "--only", "W1,B2", "--budget", "0", "--no-ceilings",
                                       "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 1
    assert "spillway: weak: not started (budget): B2; strong scaling not started: 0 s of the 0 s budget" \
        in result.output
    (f,) = tmp_path.glob("*.json")
    data = json.loads(f.read_text())
    assert [w["name"] for w in data["workloads"]] == ["W1"]
    assert data["scaling"]["skipped"]["B2"].startswith("not started: ")
    assert data["scaling"]["shapes"] == {"W1": [1500, 1500], "B2": [1500, 1500]}
    (part,) = data["scaling"]["parts"]
    assert part["workloads"] == ["W1"] and part["seconds"] > 0
    assert scaling.load_runs([f])[0] == "weak"


@pytest.mark.slow
def test_on_two_workers_one_run_serves_both_modes(tmp_path):
    result = CliRunner().invoke(main, ["bench-scaling", "run", "--cpu", "--n-workers", "2", "--mode", "both",
                                       "--sizes", "tiny", "--only", "W1", "--no-ceilings", "--out", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (f,) = tmp_path.glob("*.json")
    assert f.stem.endswith("-weak-n2")
    assert json.loads(f.read_text())["scaling"]["modes"] == ["weak", "strong"]
    assert "weak scaling on 2 workers (serves weak, strong)" in result.output


# --- on the GPU host


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_weak_study_at_one_and_two_gpus(tmp_path, gpu_count):
    if gpu_count < 2:
        pytest.skip("needs two GPUs")
    files = []
    for devices in ("0", "0,1"):
        result = CliRunner().invoke(main, ["bench-scaling", "run", "--mode", "weak", "--sizes", "small",
                                           "--only", "W1,W3", "--devices", devices, "--no-ceilings",
                                           "--out", str(tmp_path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    files = sorted(tmp_path.glob("*.json"), key=lambda f: json.loads(f.read_text())["scaling"]["workers"])
    runs = [json.loads(f.read_text()) for f in files]
    assert [r["scaling"]["workers"] for r in runs] == [1, 2]
    assert runs[0]["scaling"]["shapes"]["W1"] == [20000, 20000]
    assert runs[1]["scaling"]["shapes"]["W3"] == [40000, 40000]
    for r in runs:
        for w in r["workloads"]:
            assert w["spillway"]["error"] is None and w["spillway_s"] > 0
    assert runs[1]["workloads"][0]["transfer_gbps_median"] > 1  # NVLink or at least PCIe
    result = CliRunner().invoke(main, ["bench-scaling", "report", *map(str, files)], catch_exceptions=False)
    assert result.exit_code == 0 and "W3 (weak scaling)" in result.output
