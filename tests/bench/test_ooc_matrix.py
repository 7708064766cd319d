"""The out-of-core matrix (benchmarks/spillway_bench/matrix/): every catalogue workflow through
``spillway run`` and on the notebook path, and user-written dask code, each at a projected
footprint of at least 1.3x the GPUs' memory, checked against NumPy float64 or refused by
admission with both numbers.

GPU host: ``spillway bench --matrix SLICE`` (one device call a slice)
runs a named slice under the 10-minute limit per call; here one case is a test, for
``pytest -m gpu ... -k "user-code-qr or ..."``. Each run adds its rows to
``benchmarks/results/<machine>-<date>-ooc-matrix.{json,md,png}`` (``SPILLWAY_MATRIX_OUT``
names another directory). On CPU the same module runs a few cases at a small stand-in
scale, the slices' partition, and the merging of slices.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from spillway_bench import matrix
from spillway_bench.matrix import slices
from spillway.cli import main

CASES = matrix.cases()
REPO = Path(__file__).resolve().parents[2]
#: environment of the GPU host for processes the tests start (see tests/conftest.py)
CLI_ARGS_CPU = ("--cpu", "--n-workers", "2", "--dashboard-address", "")


def _check_row(r: dict, scale: matrix.Scale) -> None:
    """A case gives NumPy's answer at its scale, or was refused with both numbers."""
    assert r["device_bytes"] == scale.device_bytes
    assert r["footprint_bytes"] >= scale.factor * scale.device_bytes * 0.999, r
    if r["refused"]:
        assert "projected footprint" in r["error"] and "capacity" in r["error"], r
        return
    assert r["ok"], r
    assert r["rel_error"] is not None and r["rel_error"] <= r["tolerance"], r
    assert r["wall_s"] > 0 and r["spilled_bytes"] >= 0 and r["error"] is None
    # bytes each way were counted, and with the run's ceilings the copy bound is next to the time
    assert set(r["moves"]) <= set(matrix.run.bounds.MOVE_CEILINGS) and all(v >= 0 for v in r["moves"].values())
    if r.get("ceilings") is not None:
        assert r["copy_bound"]["time_s"] == r["wall_s"]


# --- the GPU host


@pytest.fixture(scope="session")
def matrix_rows():
    """Rows of the cases run in this session; the table is written at its end."""
    rows: list[dict] = []
    yield rows
    if rows:
        from spillway_bench.report import describe_machine
        from spillway.options.gpus import discover

        out = Path(os.environ.get("SPILLWAY_MATRIX_OUT", REPO / "benchmarks" / "results"))
        machine = describe_machine(discover(), "gpu")["name"]
        paths = matrix.write_table(rows, out, machine)
        print(f"\nout-of-core matrix: {', '.join(str(p) for p in paths.values())}")


@pytest.fixture(scope="session")
def gpu_scale():
    return matrix.gpu_scale()


@pytest.fixture(scope="session")
def copy_ceilings():
    """The pinned copy and disk rates, measured before any cluster of the session starts."""
    from spillway_bench import bounds

    return bounds.copy_ceilings("gpu", (0,))["gbps"]


@pytest.fixture(scope="module")
def gpu_local():
    """The notebook's cluster at spillway's defaults; started only for the notebook and
    user-code cases, after the cli cases (which start clusters of their own)."""
    import spillway

    with spillway.local() as cluster:
        yield cluster


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(580)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_on_the_gpus(case, gpu_scale, copy_ceilings, matrix_rows, request):
    cluster = request.getfixturevalue("gpu_local") if case.path not in matrix.OWN_CLUSTER else None
    r = matrix.run_case(case, gpu_scale, cluster=cluster, ceilings=copy_ceilings)
    matrix_rows.append(r)
    _check_row(r, gpu_scale)


# --- CPU: the same module at a small stand-in scale


@pytest.fixture(scope="module")
def cpu_local():
    import spillway

    with spillway.local(cpu=True, n_workers=2, dashboard_address=None) as cluster:
        yield cluster


def test_cases_cover_the_catalogue_on_two_paths_and_user_code():
    from spillway import workflows
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    for name in workflows.names():
        assert f"cli-{name}" in ids and f"notebook-{name}" in ids
    assert [c.workflow for c in CASES if c.path == "user-code"] == [
        "qr", "svd", "lstsq", "matmul", "map_overlap", "reductions", "rechunk"]
    # the shared service and the batch script run rechunk, matmul and svd
    for path in ("service", "batch"):
        assert [c.workflow for c in CASES if c.path == path] == ["rechunk", "matmul", "svd"]
    # cases with a cluster of their own first: it must not share the GPUs with the notebook's
    paths = [c.path for c in CASES]
    assert paths == sorted(paths, key=matrix.PATHS.index)
    assert set(paths[:paths.index("notebook")]) == {"cli", "service", "batch"}


@pytest.mark.parametrize("scale, slack", [
    # auto chunks step with the size at this scale: footprints move in chunk-sized steps
    (matrix.cpu_scale(device_bytes=64 * 2**20), 1.6),
    # the GPU host's: two 141 GB GPUs, 80% of each as the device limit
    (matrix.Scale(device_bytes=282 * 10**9, kind="gpu", n_workers=2, worker_bytes=int(0.8 * 141e9)), 1.05),
], ids=["cpu-standin", "two-h200"])
def test_sizes_reach_the_scale_and_no_more_than_the_slack(scale, slack):
    for case in CASES:
        if case.path == "cli":
            params, projected = matrix.workflow_params(case, scale)
            assert scale.target_bytes <= projected <= slack * scale.target_bytes, (case, projected)
            assert params["size"].endswith("B") and params["seed"] == matrix.SEED
        elif case.path == "user-code":
            n = matrix.user_size(case, scale)
            fp = matrix.USER_CODE[case.workflow](n, scale, matrix.SEED, "numpy").footprint.total_bytes
            assert scale.target_bytes <= fp <= slack * scale.target_bytes, (case, fp)


def test_gpu_scale_reads_the_gpus_memory():
    from spillway.options.gpus import GPU, Inventory

    inv = Inventory(gpus=tuple(GPU(index=i, uuid=f"GPU-{i}", name="H200", memory_total=141 * 10**9,
                                   memory_free=141 * 10**9, pci_bus_id=f"0000:0{i}:00.0") for i in range(2)))
    gpu = matrix.gpu_scale(inventory=inv)
    assert gpu.device_bytes == 282 * 10**9 and gpu.target_bytes == int(1.3 * 282 * 10**9)
    assert gpu.n_workers == 2 and gpu.worker_bytes == int(0.8 * 141 * 10**9)


def test_seeded_inputs_are_read_from_the_workflows_graph():
    from spillway import workflows
    from spillway.workflows.params import Target

    _, built = workflows.get("matmul").build_run({"size": [300, 200], "chunks": [100, 50], "seed": 3}, Target())
    found = matrix.seeded_inputs(built)
    assert found == {"x": ((300, 200), ((100,) * 3, (50,) * 4), "float64", 0),
                     "y": ((200, 300), ((50,) * 4, (100,) * 3), "float64", 1)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_case_per_path_on_cpu_and_the_table(cpu_local, tmp_path):
    from matplotlib import image

    scale = matrix.cpu_scale()
    rows = [matrix.run_case(matrix.Case("transpose-sum", "cli"), scale, cluster_args=CLI_ARGS_CPU, timeout=240),
            matrix.run_case(matrix.Case("rechunk", "notebook"), scale, cluster=cpu_local),
            matrix.run_case(matrix.Case("qr", "user-code"), scale, cluster=cpu_local)]
    for r in rows:
        _check_row(r, scale)
        assert not r["refused"]
    cli, notebook, user = rows
    assert cli["reference"] == "numpy float64 (x + x.T).sum()" and cli["process_s"] > cli["wall_s"]
    assert notebook["inputs"] == {"x": list(map(int, notebook["inputs"]["x"]))}
    assert user["rel_error"] < 1e-12 and user["reference"].startswith("|R| against the Cholesky factor")

    # refused by admission, with both numbers, before anything starts: more than device +
    # host + disk together
    disk = shutil.disk_usage(cpu_local.session.client.run(lambda dask_worker: dask_worker.local_directory)
                             .popitem()[1]).free
    huge = matrix.cpu_scale(device_bytes=2 * disk + 2**40)
    refused = matrix.run_case(matrix.Case("reductions", "user-code"), huge, cluster=cpu_local)
    assert refused["refused"] and not refused["ok"] and refused["wall_s"] is None
    assert "reductions: projected footprint" in refused["error"] and "capacity" in refused["error"]
    _check_row(refused, huge)

    # the writer: json, markdown and a PNG, merging slices into one file of the day
    paths = matrix.write_table(rows[:2], tmp_path, "cpu-test")
    paths = matrix.write_table([rows[2], refused], tmp_path, "cpu-test")
    assert paths["json"].name.startswith("cpu-test-") and paths["json"].name.endswith("-ooc-matrix.json")
    data = json.loads(paths["json"].read_text())
    assert [r["case"] for r in data["cases"]] == ["cli-transpose-sum", "notebook-rechunk", "user-code-qr",
                                                  "user-code-reductions"]
    for r in data["cases"]:
        assert {"workflow", "path", "footprint_bytes", "device_bytes", "ok", "rel_error", "wall_s",
                "spilled_bytes", "error"} <= set(r)
    md = paths["md"].read_text()
    assert "4 cases: 3 gave NumPy's answer, 1 refused by admission, 0 failed" in md
    assert "| transpose-sum | cli | " in md and "| reductions | user-code | " in md and "| refused |" in md
    assert image.imread(paths["png"]).std() > 0.01


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_service_and_batch_paths_on_cpu():
    """rechunk through `spillway serve` (a tenant added with no options, spillway.connect,
    verify=True) and through the rendered one-node batch script with the srun stand-in,
    each with its own 2 CPU workers; the rows have the cli path's columns."""
    scale = matrix.cpu_scale()
    rows = [matrix.run_case(matrix.Case("rechunk", path), scale, cluster_args=CLI_ARGS_CPU, timeout=300)
            for path in ("service", "batch")]
    for r in rows:
        _check_row(r, scale)
        assert not r["refused"] and r["process_s"] > r["wall_s"]
    service, batch = rows
    assert service["case"] == "service-rechunk" and 0 < service["submit_s"] < service["process_s"]
    assert batch["case"] == "batch-rechunk" and batch["params"] == service["params"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_notebook_and_user_code_case_on_cpu(cpu_local):
    """The whole notebook and user-code columns at the CPU scale (lstsq needs SciPy on
    CPU workers; on GPUs dask solves through CuPy)."""
    import importlib.util

    scale = matrix.cpu_scale()
    for case in CASES:
        if case.path in ("cli", "service", "batch") or (case.workflow == "lstsq" and importlib.util.find_spec("scipy") is None):
            continue
        r = matrix.run_case(case, scale, cluster=cpu_local)
        _check_row(r, scale)
        assert not r["refused"] and np.isfinite(r["rel_error"])


# --- slices: a partition of the cases that fits one device call each, merged afterwards


def test_slices_partition_the_cases_and_start_with_the_linear_algebra_that_failed():
    named = [c for members in slices.SLICES.values() for c in members]
    assert sorted(named) == sorted(c.id for c in CASES) and len(named) == len(set(named)) == 35
    assert slices.SLICES["1"][:3] == ("user-code-qr", "user-code-svd", "user-code-lstsq")
    assert list(slices.SLICES) == [str(i) for i in range(1, len(slices.SLICES) + 1)]
    name, chosen = slices.resolve("1")
    assert name == "slice-1" and [c.id for c in chosen] == list(slices.SLICES["1"])
    assert [c.id for c in slices.resolve("cli-fft, user-code-qr")[1]] == ["cli-fft", "user-code-qr"]
    assert len(slices.resolve("all")[1]) == 35
    with pytest.raises(ValueError, match="'nope' is not a slice"):
        slices.resolve("cli-fft,nope")


def _rows(ids, wall, scale):
    return [matrix.with_bound(matrix.row(matrix.case_by_id(i), scale, ok=True, rel_error=0.0, tolerance=1e-10,
                                         wall_s=wall, spilled_bytes=10**9, footprint_bytes=10**9,
                                         moves={"device_to_host": 10**9, "host_to_device": 10**9}),
                              {"d2h_pinned": 50.0, "h2d_pinned": 25.0}, scale.n_workers) for i in ids]


def test_slices_fetched_from_separate_calls_merge_into_one_table(tmp_path):
    from datetime import datetime, timezone

    scale = matrix.cpu_scale()
    day1 = datetime(2026, 11, 24, 23, 50, tzinfo=timezone.utc)
    day2 = datetime(2026, 11, 25, 0, 10, tzinfo=timezone.utc)
    first, second, out = tmp_path / "call1", tmp_path / "call2", tmp_path / "results"
    matrix.write_table(_rows(["user-code-qr", "cli-fft"], 3.0, scale), first, "1x-h100", when=day1,
                       slices=[{"name": "slice-1", "started": day1.isoformat(), "finished": day1.isoformat()}])
    # the second call ran after midnight, and ran cli-fft again
    matrix.write_table(_rows(["cli-fft", "notebook-gather"], 9.0, scale), second, "1x-h100", when=day2,
                       slices=[{"name": "slice-2", "started": day2.isoformat(), "finished": day2.isoformat()}])
    result = CliRunner().invoke(main, ["bench", "--matrix-merge", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (merged,) = out.glob("*.json")
    assert merged.name == "1x-h100-2026-11-24-ooc-matrix.json"  # the first slice's day
    data = json.loads(merged.read_text())
    assert [r["case"] for r in data["cases"]] == ["cli-fft", "notebook-gather", "user-code-qr"]
    assert {r["case"]: r["wall_s"] for r in data["cases"]} == {"cli-fft": 9.0, "notebook-gather": 9.0,
                                                               "user-code-qr": 3.0}
    assert [s["name"] for s in data["slices"]] == ["slice-1", "slice-2"]
    # 1 GB each way over 50 and 25 GB/s, two GPUs' links: 0.01 + 0.02 s
    assert data["cases"][0]["copy_bound"]["bound_s"] == pytest.approx(0.03)
    assert data["cases"][0]["copy_bound"]["ratio"] == pytest.approx(300.0)
    md = merged.with_suffix(".md").read_text()
    assert "| fft | cli | " in md and "| 0.93 GiB / 0.93 GiB | — | 0.03 | 300.0x |" in md
    assert "Slices: slice-1 (0 cases" in md
    # merging again (a third call's file next to the merged one) keeps the rows
    again = CliRunner().invoke(main, ["bench", "--matrix-merge", str(first), "--out", str(out)])
    assert again.exit_code == 0 and len(json.loads(merged.read_text())["cases"]) == 3
    other = tmp_path / "other"
    matrix.write_table(_rows(["cli-fft"], 1.0, scale), other, "2x-h200", when=day1)
    with pytest.raises(ValueError, match="different machines"):
        matrix.merge_files([merged, next(other.glob("*.json"))], out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_matrix_command_runs_slices_into_one_file_and_keeps_to_its_budget(tmp_path):
    """``spillway bench --matrix`` on CPU workers: two calls add to one table of the day,
    each row with its copy ceilings and bound; a case past the budget is not started."""
    args = ["bench", "--cpu", "--n-workers", "2", "--dashboard-address", "", "--out", str(tmp_path)]
    one = CliRunner().invoke(main, [*args, "--matrix", "cli-transpose-sum,notebook-rechunk"])
    assert one.exit_code == 0, one.output
    two = CliRunner().invoke(main, [*args, "--matrix", "user-code-qr"])
    assert two.exit_code == 0, two.output
    (path,) = tmp_path.glob("*-ooc-matrix.json")
    data = json.loads(path.read_text())
    assert [r["case"] for r in data["cases"]] == ["cli-transpose-sum", "notebook-rechunk", "user-code-qr"]
    assert len(data["slices"]) == 2 and all(s["finished"] for s in data["slices"])
    for r in data["cases"]:
        _check_row(r, matrix.cpu_scale())
        assert set(r["ceilings"]) >= {"disk_write", "disk_read"} and r["copy_bound"]["time_s"] == r["wall_s"]
        # the host during the case, sampled by the bench process
        assert 0 < r["host_peak_used_bytes"] and 0 < r["host_min_available_bytes"] and r["host_headroom_bytes"]
        assert r["oom_kills"] == "unknown" or r["oom_kills"] == [], r["oom_kills"]
    assert two.stdout.splitlines()[0].split()[:4] == ["case", "status", "wall", "s"]
    # the ceilings alone take longer than a one-second budget: nothing starts, and it says so
    late = CliRunner().invoke(main, [*args, "--matrix", "user-code-svd", "--budget", "1"])
    assert late.exit_code == 1
    row = [r for r in json.loads(path.read_text())["cases"] if r["case"] == "user-code-svd"][0]
    assert row["error"].startswith("not started: the slice's budget of 1 s was spent") and row["wall_s"] is None


def test_the_matrix_command_refuses_workload_flags():
    result = CliRunner().invoke(main, ["bench", "--matrix", "1", "--only", "W1"])
    assert result.exit_code != 0 and "--only does not apply" in result.output
    result = CliRunner().invoke(main, ["bench", "--budget", "10"])
    assert result.exit_code != 0 and "budget: only used with --matrix" in result.output


# --- the host during each case


def test_host_watch_records_the_peak_the_lowest_available_and_new_oom_kills():
    from spillway_bench.matrix.hostwatch import HostWatch

    GiB = 2**30
    readings = iter([{"MemTotal": 128 * GiB, "MemAvailable": a * GiB} for a in (100, 60, 9, 40)])
    last = {"MemTotal": 128 * GiB, "MemAvailable": 40 * GiB}
    logs = iter([["[1.0] Out of memory: Killed process 7 (python)"],
                 ["[1.0] Out of memory: Killed process 7 (python)",
                  "[9.0] Out of memory: Killed process 811 (python) anon-rss:114949616kB"]])
    watch = HostWatch(interval=3600, read=lambda: next(readings, last), oom_lines=lambda: next(logs))
    with watch:
        for _ in range(3):
            watch._sample()
    fields = watch.fields()
    assert fields["host_peak_used_bytes"] == 119 * GiB and fields["host_min_available_bytes"] == 9 * GiB
    # the store's headroom is a tenth of the machine: 12.8 GiB, and 9 GiB is under it
    assert fields["host_headroom_bytes"] == int(12.8 * GiB) and fields["under_headroom"] is True
    assert fields["oom_kills"] == ["[9.0] Out of memory: Killed process 811 (python) anon-rss:114949616kB"]


def test_an_unreadable_kernel_log_is_unknown_not_none():
    from spillway_bench.matrix.hostwatch import HostWatch, meminfo

    with HostWatch(interval=0.05, oom_lines=lambda: None) as watch:
        time.sleep(0.2)
    fields = watch.fields()
    assert fields["oom_kills"] == "unknown"
    info = meminfo()
    assert fields["host_total_bytes"] == info["MemTotal"] and watch.samples >= 2
    assert 0 < fields["host_min_available_bytes"] <= info["MemTotal"]
    assert fields["under_headroom"] == (fields["host_min_available_bytes"] < fields["host_headroom_bytes"])


def test_host_columns_in_the_table_flag_low_memory_and_kills(tmp_path):
    scale = matrix.cpu_scale()
    rows = _rows(["user-code-qr", "cli-fft", "cli-gather"], 3.0, scale)
    rows[0].update(host_peak_used_bytes=118 * 10**9, host_min_available_bytes=3 * 10**9,
                   host_headroom_bytes=13 * 10**9, under_headroom=True, oom_kills=[])
    rows[1].update(host_peak_used_bytes=50 * 10**9, host_min_available_bytes=70 * 10**9,
                   host_headroom_bytes=13 * 10**9, under_headroom=False, oom_kills=["Killed process 9"])
    paths = matrix.write_table(rows, tmp_path, "1x-h100")
    md = paths["md"].read_text()
    assert "| 109.90 GiB / 2.79 GiB **under 12.11 GiB** | none |" in md
    assert "| 46.57 GiB / 65.19 GiB | **1** |" in md
    assert "| — | unknown |" in md  # the third: not measured
    data = json.loads(paths["json"].read_text())
    assert {r["case"]: r["oom_kills"] for r in data["cases"]}["cli-fft"] == ["Killed process 9"]
    assert paths["png"].stat().st_size > 0
    short = slices.short_table(rows)
    assert "UNDER HEADROOM" in short and "OOM kills 1" in short

