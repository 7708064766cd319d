"""``spillway bench``: the workloads against NumPy, the harness on real CPU clusters, the
files it writes, and (on the GPU host) the ceilings and a run against dask-cuda."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from click.testing import CliRunner

from reference_inputs import uniform_numpy
from spillway_bench import ceilings, clusters, harness, measure, prepare, workloads
from spillway_bench.measure import SideResult
from spillway.cli import main
from spillway.options.gpus import Inventory
from spillway.options.settings import Options
from spillway.workflows import random
from spillway.workflows.params import Target

NAMES = ["W1", "W2", "W3", "W4", "W5", "B1", "B2"]
#: a plain ``spillway bench``: the in-memory rows, the out-of-core rows O3 and O4
#: (tests/bench/test_out_of_core.py), then B1 and B2
DEFAULT = ["W1", "W2", "W3", "W4", "W5", "O3", "O4", "O5", "B1", "B2"]


def rel_error(computed, reference) -> float:
    c = np.asarray(computed, dtype=np.asarray(reference).dtype)
    return float(np.linalg.norm((c - reference).ravel()) / np.linalg.norm(np.asarray(reference).ravel()))


# --- the workloads compute what they say, checked against NumPy float64


def _reference(name, p, seed):
    a = uniform_numpy(p["shape"], seed=seed, dtype="float64") if name != "W4" else None
    if name in ("W1", "B1", "B2"):
        return (a + a.T).sum()
    if name == "W2":
        b = uniform_numpy(p["shape"], seed=seed, stream=1, dtype="float64")
        return a @ b
    if name == "W3":
        return a
    if name == "W4":
        loc = tuple((0, s) for s in p["shape"])
        re = random.uniform_block(seed, 0, p["shape"], loc, "float64", "numpy")
        im = random.uniform_block(seed, 1, p["shape"], loc, "float64", "numpy")
        return np.fft.fft(re + 1j * im, axis=0)
    if name == "W5":
        a = uniform_numpy(p["shape"], seed=seed, dtype="float32").astype(np.float64)
        padded = np.pad(a, 1)
        out = -6 * a
        for axis in range(3):
            for shift in (-1, 1):
                out += np.roll(padded, shift, axis=axis)[1:-1, 1:-1, 1:-1]
        return out
    raise AssertionError(name)


@pytest.mark.parametrize("name", NAMES)
def test_direct_workloads_match_numpy(name):
    w = workloads.WORKLOADS[name]
    p = w.params("tiny")
    result = w.direct(p, "numpy", 7)
    computed = result.compute(scheduler="sync")
    reference = _reference(name, p, 7)
    tolerance = 1e-5 if p["dtype"] == "float32" else 1e-10
    assert rel_error(computed, reference) <= tolerance
    if name == "W3":
        assert result.chunks[0] == (p["shape"][0],)


def test_registered_workflow_is_used_and_marked():
    built = workloads.WORKLOADS["W1"].build("tiny", Target(kind="cpu", n_workers=2), seed=3)
    assert built.source == "workflow transpose-sum"
    w = workloads.WORKLOADS["W1"]
    p = w.params("tiny")
    assert rel_error(built.result.compute(scheduler="sync"), _reference("W1", p, 3)) <= 1e-10


def test_select_and_sizes():
    assert [w.name for w in workloads.select("b2, w1")] == ["W1", "B2"]
    assert [w.name for w in workloads.select(None)] == DEFAULT
    full = workloads.WORKLOADS
    assert full["W1"].params("full")["shape"] == (40000, 40000)
    assert full["W1"].params("full")["chunks"] == (10000, 10000)
    assert full["W2"].params("full")["chunks"] == (5000, 5000)
    assert full["W3"].params("full")["chunks"] == (1000, 80000)
    assert full["W3"].params("full")["to_chunks"] == (80000, 1000)
    assert full["W4"].params("full")["dtype"] == "complex128"
    assert full["W5"].params("full")["shape"] == (2048,) * 3
    assert full["B1"].input_bytes("full") == 204_800_000_000
    assert full["B2"].input_bytes("full") == 51_200_000_000
    assert full["B2"].gpu_cluster == {"device_memory_limit": "12GB"}


# --- one-line errors before anything starts


@pytest.mark.parametrize("args, fragment", [
    (["--only", "W9"], "only: 'W9' is not a workload (known: W1, W2, W3, W4, W5, O3, O4, O5, B1, B2, B3, B4, B5)"),
    (["--runs", "2"], "2 is not in the range x>=3"),
    (["--only", "B1", "--sizes", "full"], "sizes: B1 at full needs 190.73 GiB of input, more than"),
    (["--scheduler-address", "tcp://127.0.0.1:1"], "bench starts its own clusters"),
    (["--label", "step 1"], "label: 'step 1' must be 1 to 40 letters, digits, '_', '.' or '-'"),
    (["--label", "x" * 41], "label: '" + "x" * 41 + "' must be 1 to 40"),
    (["--label", "../up"], "label: '../up' must be 1 to 40"),
    (["--transfer-connections", "0"], "transfer-connections: 0 must be >= 1"),
    (["--sweep-sizes", "1MB"], "sweep-sizes: '1MB' is only used with --link-sweep"),
    (["--link-sweep", "--sweep-sizes", "1KB"], "sweep-sizes: '1KB' is below the minimum of 4.00 kiB"),
    (["--link-sweep", "--sweep-sizes", "1MB,huge"], "sweep-sizes: cannot parse 'huge' as a size"),
    (["--link-sweep", "--sweep-sizes", ","], "sweep-sizes: ',' names no size"),
    (["--link-sweep", "--sweep-sizes", ",".join(f"{n}MB" for n in range(1, 18))],
     "sweep-sizes: 17 sizes given, more than the limit of 16"),
    (["--link-sweep", "--sweep-sizes", "1PB"], "sweep-sizes: 909.49 TiB needs 1.78 PiB of host memory, more than half"),
    (["--link-sweep", "--only", "W1", "--no-baseline"],
     "link-sweep: measures the link, not the workloads; --only, --no-baseline does not apply"),
    (["--link-sweep", "--label", "a b"], "label: 'a b' must be"),
])
def test_bad_input_fails_with_one_line_before_starting(args, fragment, tmp_path):
    result = CliRunner().invoke(main, ["bench", "--cpu", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert fragment in result.output
    assert not list(tmp_path.iterdir())


def test_bench_options_fill_only_unset_values():
    assert clusters.bench_options(Options.resolve(), "gpu").rmm_pool_size == 0.85
    assert clusters.bench_options(Options.resolve(), "gpu").dashboard_address is None
    assert clusters.bench_options(Options.resolve(), "cpu").rmm_pool_size == "auto"  # untouched
    assert clusters.bench_options(Options.resolve(rmm_pool_size="10GB"), "gpu").rmm_pool_size == 10**10
    assert clusters.bench_options(Options.resolve(rmm_async=True), "gpu").pool_size is None
    user = clusters.bench_options(Options.resolve({"dashboard_address": ":8799"}), "gpu")
    assert user.dashboard_address == ":8799" and user.sources["dashboard_address"] == "flag --dashboard-address"


def test_bandwidth_percentiles_skip_small_transfers():
    side = SideResult(transfers=[(10, 1e-6), (2_000_000, 1e-3), (4_000_000, 1e-3), (8_000_000, 1e-3)])
    bw = side.bandwidth()
    assert bw["count"] == 3
    assert bw["p25"] == pytest.approx(3.0) and bw["median"] == pytest.approx(4.0)
    assert bw["p75"] == pytest.approx(6.0)
    assert side.bandwidth(measure.LARGE_TRANSFER_BYTES)["median"] is None


# --- the harness on real clusters


@pytest.fixture
def cpu_cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster, timeout="30s") as client:
        client.register_plugin(clusters.SpillCounter())
        yield client


def test_inputs_are_persisted_and_not_recomputed(cpu_cluster):
    client = cpu_cluster
    w = workloads.WORKLOADS["W1"]
    p = w.params("tiny")
    lazy = w.direct(p, "numpy", 11)
    futures, op = measure.split_inputs(client, lazy, timeout=60)
    assert len(futures) == math.prod(n // c for n, c in zip(p["shape"], p["chunks"]))
    assert all(f.status == "finished" for f in futures)
    value = client.compute(op).result(timeout=60)
    assert rel_error(value, _reference("W1", p, 11)) <= 1e-10
    computed = client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.task_prefixes["uniform"].state_counts["memory"])
    assert computed == len(futures)  # the timed graph reused them
    del futures, op
    assert measure.wait_released(client, timeout=30)


def test_timed_run_measures_transfers_and_releases(cpu_cluster):
    client = cpu_cluster
    w = workloads.WORKLOADS["W2"]
    m = measure.timed_run(client, w.direct(w.params("tiny"), "numpy", 5), kind="cpu", timeout=60)
    assert m.seconds > 0
    assert m.bytes_moved > 0 and all(b > 0 and s > 0 for b, s in m.transfers)
    assert m.bytes_spilled == 0
    assert measure.wait_released(client, timeout=30)


def _failing(p, backend, seed):
    import dask.array as da

    def boom(block):
        raise ValueError("chunk went bad")

    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype="float64", backend=backend)
    return da.map_blocks(boom, x, dtype="float64").sum()


def test_a_failing_workload_is_recorded_and_the_rest_still_runs(tmp_path):
    import contextlib

    from distributed import Client, LocalCluster

    bad = workloads.Workload(name="X1", title="fails", workflow=None,
                             sizes={"tiny": workloads.WORKLOADS["W1"].params("tiny")}, direct=_failing)
    good = workloads.WORKLOADS["W1"]
    options = Options.resolve(cpu=True, n_workers=2, dashboard_address=None)
    plan = prepare(options, only="W1", sizes="tiny", inventory=Inventory(reason="test"))
    plan.workloads = [bad, good]
    opened = []

    @contextlib.contextmanager
    def side(*_args):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                          dashboard_address=None) as cluster, Client(cluster) as client:
            client.register_plugin(clusters.SpillCounter())
            opened.append(cluster)
            yield client, {"kind": "cpu", "n_workers": 2, "protocol": "inproc"}

    lines = []
    outcome = harness.run(plan, log=lines.append, spillway=side, baseline=side)
    for name in ("spillway", "baseline"):
        assert "chunk went bad" in outcome["results"]["X1"][name].error
        assert len(outcome["results"]["W1"][name].runs_s) == 3
    assert len(opened) == 4  # each side restarted its cluster after the failure
    assert any("X1 spillway FAILED" in line for line in lines)


# --- the whole command: the CI smoke run


SCHEMA = {
    "type": "object",
    "required": ["machine", "ceilings", "workloads"],
    "properties": {
        "machine": {"type": "object", "required": ["name", "cpu", "cores", "memory_total", "gpus"]},
        "ceilings": {"type": "object", "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
        "workloads": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "spillway_s", "baseline_s", "speedup", "transfer_gbps_median",
                             "peer_copy_gbps", "transfer_ratio_to_peer_copy", "bytes_moved",
                             "bytes_spilled", "spillway", "baseline"],
                "properties": {
                    "name": {"enum": DEFAULT},
                    "spillway_s": {"type": "number", "exclusiveMinimum": 0},
                    "baseline_s": {"type": "number", "exclusiveMinimum": 0},
                    "speedup": {"type": "number", "exclusiveMinimum": 0},
                    "transfer_gbps_median": {"type": ["number", "null"]},
                    "peer_copy_gbps": {"type": ["number", "null"]},
                    "bytes_moved": {"type": "integer", "minimum": 0},
                    "bytes_spilled": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
}


@pytest.mark.slow
def test_cpu_smoke_run_writes_json_markdown_and_png(tmp_path):
    import jsonschema
    from matplotlib import image

    result = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--sizes", "tiny",
                                       "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output

    stems = {p.stem for p in tmp_path.iterdir()}
    assert len(stems) == 1 and next(iter(stems)).startswith("cpu-")
    (stem,) = stems
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    jsonschema.validate(data, SCHEMA)
    assert [w["name"] for w in data["workloads"]] == DEFAULT
    assert data["sizes"] == "tiny" and data["runs"] == 3
    assert data["ceilings"]["host_copy"] > 0
    assert "peer_copy" in data["ceilings_skipped"]
    assert data["clusters"]["baseline"]["cluster"].startswith("LocalCluster(n_workers=2")
    assert data["clusters"]["spillway"]["n_workers"] == 2
    assert data["clusters"]["spillway"]["transport"] == data["clusters"]["baseline"]["transport"] == "tcp"
    for w in data["workloads"]:
        assert w["speedup"] == pytest.approx(w["baseline_s"] / w["spillway_s"])
        out_of_core = w["name"] in ("O3", "O4", "O5")
        for side in ("spillway", "tasks_method", "baseline") if out_of_core else ("spillway", "baseline"):
            assert len(w[side]["runs_s"]) == 3 and w[side]["warmup_s"] > 0
            assert w[side]["median_s"] == pytest.approx(sorted(w[side]["runs_s"])[1])
            assert w[side]["error"] is None
            # the out-of-core rows' warm-up is the first run on the side's own cluster
            assert w[side]["first_s"] == (w[side]["warmup_s"] if out_of_core else None)
        assert w["peer_copy_gbps"] is None and w["transfer_ratio_to_peer_copy"] is None
        # CPU workers have no tiered store: spills are counted, not timed
        assert w["spill_throughput"] is None and w["baseline_spill_throughput"].startswith("not measured")
        # the out-of-core rows check their result against NumPy
        assert w["persist_s"] > 0 and (w["verify"]["ok"] if out_of_core else w["verify"] is None)
    # the run names its previous result: none in an empty directory
    assert data["previous"]["file"] is None and data["slower"] == [] and len(data["new"]) > len(DEFAULT)
    w1 = data["workloads"][0]
    # half of x crosses between the two workers for x.T
    assert w1["bytes_moved"] > 0 and w1["baseline_bytes_moved"] > 0
    assert 0 < w1["transfer_gbps_p25"] <= w1["transfer_gbps_median"] <= w1["transfer_gbps_p75"]
    assert w1["spillway"]["source"] == "workflow transpose-sum"

    md = (tmp_path / f"{stem}.md").read_text()
    assert "| workload | spillway s | baseline s | speedup |" in md
    assert "- spillway: 2 cpu workers over tcp;" in md
    for name in DEFAULT:
        assert f"| {name}: " in md
    assert "| peer_copy | skipped: CPU workers" in md
    assert "## Out of core, fresh clusters" in md and "## Against the previous result" in md

    png = tmp_path / f"{stem}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(png)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 400 and pixels.std() > 0.01

    log = (tmp_path / f"{stem}.log").read_text()
    assert "W1 spillway run 3/3" in log and "B2 baseline run 3/3" in log

    out = result.stdout.strip().splitlines()
    start = next(i for i, row in enumerate(out) if row.split()[:4] == ["workload", "spillway", "s", "baseline"])
    assert [row.split()[0] for row in out[start + 1:start + 1 + len(DEFAULT)]] == DEFAULT
    assert out[start + len(DEFAULT) + 2] == "out of core, a fresh cluster per side:"
    assert [row.split()[:2] for row in out[-9:]] == [[n, s] for n in ("O3", "O4", "O5")
                                                     for s in ("spillway", "tasks_method", "baseline")]


# --- on the GPU host


@pytest.mark.gpu
def test_ceilings_on_the_gpus(gpu_count):
    found = ceilings.measure("gpu", tuple(range(min(2, gpu_count))), 256 * 2**20)
    for name in ("hbm_copy", "h2d_pinned", "d2h_pinned"):
        assert found.gbps[name] > 1, found
    assert found.gbps["hbm_copy"] > found.gbps["h2d_pinned"]
    if gpu_count >= 2:
        assert found.gbps["peer_copy_0_to_1"] > 1 and found.gbps["peer_copy_1_to_0"] > 1
        assert found.gbps["ucxx_send_recv"] > 1, found.skipped


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_small_gpu_run_against_dask_cuda(tmp_path, gpu_count):
    result = CliRunner().invoke(main, ["bench", "--only", "W1,B2", "--sizes", "small",
                                       "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    assert data["clusters"]["spillway"]["kind"] == "gpu"
    # the baseline is what a user gets: UCX where distributed-ucxx is installed (a one-GPU
    # host is given the stack without it), TCP otherwise, and the report says which
    from spillway.launch.plan import ucxx_installed

    protocol = "ucx" if ucxx_installed() else "tcp"
    assert data["clusters"]["baseline"]["cluster"].startswith(f"LocalCUDACluster(protocol='{protocol}'")
    assert data["ceilings"]["hbm_copy"] > 0 and data["ceilings"]["h2d_pinned"] > 0
    for w in data["workloads"]:
        assert w["spillway_s"] > 0 and w["baseline_s"] > 0
        if gpu_count >= 2:
            assert data["clusters"]["spillway"]["protocol"] == "ucx"
            assert data["clusters"]["baseline"]["protocol"] == "ucx"
            assert w["transfer_gbps_median"] > 0 and w["peer_copy_gbps"] > 0
            assert w["bytes_moved"] > 0
    b2 = data["workloads"][1]
    # 28.8 GB of input over two workers allowed 12 GB each: both sides must spill
    assert b2["name"] == "B2" and b2["bytes_spilled"] > 0 and b2["baseline_bytes_spilled"] > 0
    # spillway's tiered store times its copies; the pinned ceilings of the same run
    d2h = b2["spill_throughput"]["device_to_host"]
    assert d2h["bytes"] > 0 and d2h["seconds"] > 0 and d2h["gbps_per_worker"] > 0
    assert d2h["ceiling"] == "d2h_pinned" and d2h["ratio_to_ceiling"] > 0
    assert b2["spill_ratio_to_pinned"] is not None and b2["restore_wait_s"] is not None
    assert b2["baseline_spill_throughput"].startswith("not measured")
    spill = [t for t in data["targets"] if t["name"] == "B2" and "spill" in t["target"]]
    assert len(spill) == 1 and spill[0]["met"] in (True, False)
    if gpu_count >= 2:
        assert data["clusters"]["spillway"]["transport"] == "ucx (CUDA IPC over NVLink)"
    md = (tmp_path / path.name.replace(".json", ".md")).read_text()
    assert "## Spill throughput" in md and "| B2 | spillway | device -> host |" in md
    assert (tmp_path / path.name.replace(".json", ".png")).stat().st_size > 10_000


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_b3_small_over_the_tiers_on_gpus_checked_against_numpy(tmp_path, gpu_count):
    result = CliRunner().invoke(main, ["bench", "--only", "B3", "--sizes", "small", "--no-ceilings",
                                       "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    (b3,) = data["workloads"]
    assert b3["verify"]["ok"] and b3["verify"]["rel_error"] <= 1e-10
    assert b3["baseline"]["skipped"] and b3["baseline_s"] is None
    # 57.6 GB per worker (b3_small) over workers holding 30 GB on the device and 20 GB on the host each
    tiers = b3["resident_after_persist"]
    n = data["clusters"]["spillway"]["n_workers"]
    assert n * 50e9 < b3["input_bytes"]  # so part of it is on disk
    assert tiers["device"] <= n * 30e9 * 1.05 and tiers["host"] > 0 and tiers["disk"] > 0
    assert tiers["device"] + tiers["host"] + tiers["disk"] >= b3["input_bytes"]
    assert 0 < tiers["disk_stored"] <= tiers["disk"]  # the disk holds its values compressed or as they are
    moves = b3["spill_throughput"]
    assert moves["disk_to_host"]["bytes"] > 0 and moves["host_to_device"]["bytes"] > 0
    assert moves["host_to_device"]["gbps_per_worker"] > 0 and b3["restore_wait_s"] > 0
    assert b3["persist_s"] > 0 and b3["spillway_s"] > 0


def test_ceilings_not_measurable_here_are_skipped_with_the_reason(monkeypatch, gpu_count):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert ceilings.physical((1, 0, "GPU-ab")) == ("5", "3", "GPU-ab")
    cpu = ceilings.measure("cpu", (), 4 * 2**20)
    # the disk tier's ceilings are measured everywhere, through the store's own code
    assert cpu.gbps["disk_write"] > 0 and cpu.gbps["disk_read"] > 0
    assert cpu.gbps["host_copy"] > 0.1 and cpu.peer_copy is None
    assert cpu.skipped["peer_copy"] == "CPU workers: no GPU in this run"
    if gpu_count:
        return
    # asked for GPU ceilings where CuPy or the GPUs are missing: each one says why
    found = ceilings.measure("gpu", (0, 1), 2**20, timeout=120)
    assert set(found.gbps) == {"host_copy", "disk_write", "disk_read"}
    assert "measurement failed" in found.skipped["hbm_copy"]
    assert found.skipped["ucxx_send_recv"]


def test_probes_run_as_a_module_the_package_does_not_import():
    import os
    import subprocess
    import sys

    # importing the package must not import the module its children run with -m
    code = "import sys, spillway_bench, spillway_bench.ceilings; print('spillway_bench.probes' in sys.modules)"
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
    assert ceilings.PROBE[1:] == ("-m", "spillway_bench.probes")
    # started as the ceilings start it, with warnings as errors: no runpy warning on stderr
    child = subprocess.run([*ceilings.PROBE, "no-such-probe", "1"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONWARNINGS": "error"})
    assert child.returncode == 1
    assert child.stderr.strip() == "unknown measurement 'no-such-probe'"


def _server(tmp_path, script: str, timeout: float = 20):
    import sys

    errors = (tmp_path / "stderr").open("w+")
    try:
        return ceilings.start_server([sys.executable, "-c", script], {}, errors, timeout=timeout)
    finally:
        errors.close()


def test_server_start_waits_for_its_ready_line_past_warnings_and_noise(tmp_path):
    import textwrap

    script = textwrap.dedent("""
        import json, sys, time, warnings
        warnings.warn("something at start-up", RuntimeWarning)
        print("loading", flush=True)
        time.sleep(0.3)
        print("not json {", "\\n{broken", sep="", flush=True)
        print(json.dumps({"port": 4321}), "\\nafter", sep="", flush=True)
        sys.stdin.close()
        time.sleep(0.5)
    """)
    proc, ready = _server(tmp_path, script)
    assert ready == {"port": 4321}
    assert proc.wait(timeout=10) == 0


def test_server_that_exits_or_stays_silent_fails_with_the_reason(tmp_path):
    script = ("import sys, warnings; warnings.warn('noise', UserWarning); "
              "print('OSError: no CUDA device', file=sys.stderr); sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"^exited with status 3: OSError: no CUDA device$"):
        _server(tmp_path, script)
    with pytest.raises(RuntimeError, match=r"^no ready line within 1 s: .*Warning: quiet"):
        _server(tmp_path, "import time, warnings; warnings.warn('quiet'); time.sleep(60)", timeout=1)


def test_last_error_skips_warnings():
    assert ceilings.last_error("") == "no output"
    text = ("Traceback (most recent call last):\nRuntimeError: UCX failed\n"
            "<frozen runpy>:128: RuntimeWarning: 'x' found in sys.modules\n")
    assert ceilings.last_error(text) == "RuntimeError: UCX failed"
    assert ceilings.last_error("a.py:1: UserWarning: only this\n  warnings.warn(x)\n").endswith("only this")


def test_targets_are_judged_on_gpus_only():
    from spillway_bench.report import targets

    ws = [{"name": "W1", "speedup": 2.5, "transfer_256mib_ratio_to_peer_copy": 0.7},
          {"name": "B1", "speedup": 1.0, "transfer_256mib_ratio_to_peer_copy": None}]
    judged = {(t["name"], "faster" in t["target"]): t["met"] for t in targets(ws, "gpu")}
    assert judged == {("W1", False): False, ("W1", True): True, ("B1", False): None}
    assert all(t["met"] is None for t in targets(ws, "cpu"))


@pytest.mark.slow
def test_runs_split_over_commands_merge_into_one_file(tmp_path):
    first = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "B2",
                                      "--out", str(tmp_path)], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    (path,) = tmp_path.glob("*.json")
    before = json.loads(path.read_text())

    wrong = CliRunner().invoke(main, ["bench", "--cpu", "--only", "W1", "--runs", "4",
                                      "--merge-into", str(path)])
    assert wrong.exit_code == 2
    assert "holds cpu-" in wrong.output and "this run is" in wrong.output and "4 runs" in wrong.output

    second = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "W1",
                                       "--out", str(tmp_path), "--merge-into", str(path)],
                                catch_exceptions=False)
    assert second.exit_code == 0, second.output
    merged = json.loads(path.read_text())
    assert [w["name"] for w in merged["workloads"]] == ["W1", "B2"]
    assert merged["workloads"][1] == before["workloads"][0]
    assert merged["ceilings"] == before["ceilings"]
    assert [p["workloads"] for p in merged["parts"]] == [["B2"], ["W1"]]
    md = path.with_suffix(".md").read_text()
    assert "| W1: " in md and "| B2: " in md and "- runs: B2 from" in md
    assert len(list(tmp_path.glob("*.json"))) == 1 and len(list(tmp_path.glob("*.log"))) == 2


def test_b2_gets_its_own_clusters_with_the_device_limit_on_gpus():
    from spillway.launch import LaunchPlan

    gpu = LaunchPlan(kind="gpu", devices=(0, 1), n_workers=2, protocol="ucx")
    plan = harness.BenchRun(options=Options.resolve(rmm_pool_size=0.85), launch=gpu, inventory=None,
                        workloads=workloads.select("W1,W3,B2,B1"), scale="small", runs=3, timeout=60)
    split = [(changes, [w.name for w in ws]) for changes, ws in harness.groups(plan)]
    b2 = {"device_memory_limit": "12GB"}
    assert split == [({"spillway": {}, "baseline": {}}, ["W1", "W3", "B1"]),
                     ({"spillway": b2, "baseline": b2}, ["B2"])]
    assert plan.options.replace(**split[1][0]["spillway"]).device_memory_limit == 12_000_000_000
    cpu = harness.BenchRun(options=Options.resolve(), launch=LaunchPlan(kind="cpu", n_workers=2),
                       inventory=None, workloads=plan.workloads, scale="tiny", runs=3, timeout=60)
    assert [changes for changes, _ in harness.groups(cpu)] == [{"spillway": {}, "baseline": {}}]


def test_b3_is_named_to_run_with_its_own_tiers_on_spillway_only():
    from spillway.launch import LaunchPlan

    b3 = workloads.WORKLOADS["B3"]
    assert "B3" not in [w.name for w in workloads.select(None)]
    assert [w.name for w in workloads.select("b3")] == ["B3"]
    assert b3.input_bytes("full") == 423_200_000_000 and b3.chunk_bytes("full") == 800_000_000
    assert b3.baseline_skip and "not run" in b3.baseline_skip and not b3.warmup
    gpu = LaunchPlan(kind="gpu", devices=(0, 1), n_workers=2, protocol="ucx")
    plan = harness.BenchRun(options=Options.resolve(), launch=gpu, inventory=None, workloads=[b3],
                        scale="full", runs=3, timeout=60)
    ((changes, members),) = harness.groups(plan)
    assert changes["baseline"] == {}
    tiers = plan.options.replace(**changes["spillway"])
    assert (tiers.device_memory_limit, tiers.memory_limit, tiers.pinned_pool_size) == (125e9, 52e9, 48e9)
    # per worker: the device limit, then the pinned pool, then disk for the rest
    per_worker = b3.input_bytes("full") / 2
    assert tiers.device_memory_limit + tiers.memory_limit < per_worker
    small = plan.options.replace(**b3.cluster_changes("small", "gpu", "spillway"))
    assert small.device_memory_limit + small.memory_limit < b3.input_bytes("small") / 2
    assert b3.cluster_changes("tiny", "cpu", "spillway") == {}
    # one checked run at full size (minutes each); the asked-for count elsewhere
    assert (b3.timed_runs("full", 3), b3.timed_runs("small", 3), b3.timed_runs("tiny", 5)) == (1, 3, 5)


def test_reference_panels_match_numpy(monkeypatch):
    from spillway_bench import reference

    shape, seed = (300, 200), 5
    x = uniform_numpy(shape, seed=seed, dtype="float64")
    expected = 2 * x.sum()  # what (x + x.T).sum() is; the square case is checked below
    monkeypatch.setattr(reference, "PANEL_BYTES", 200 * 8 * 7)  # 7 rows per panel: 43 panels
    assert reference.transpose_sum(shape, seed, processes=1) == pytest.approx(expected, rel=1e-13)
    assert reference.transpose_sum(shape, seed, processes=2) == pytest.approx(expected, rel=1e-13)
    sq = uniform_numpy((64, 64), seed=9, dtype="float64")
    assert reference.transpose_sum((64, 64), 9, processes=1) == pytest.approx((sq + sq.T).sum(), rel=1e-13)


# --- spill throughput


def _snap(store_bytes=None, store_seconds=None, wait=0.0, spilled=None):
    store = None
    if store_bytes is not None:
        # the disk's 3 bytes of values stored compressed in 1
        store = {"device_bytes": 4, "host_bytes": 2, "disk_bytes": 1, "disk_raw_bytes": 3,
                 "stats": {"bytes": store_bytes, "seconds": store_seconds, "wait_s": wait}}
    return {"store": store, "spilled": spilled or {}}


def test_spill_moves_are_summed_over_workers_and_timed_only_by_the_tiered_store():
    zero = dict.fromkeys(measure.MOVES, 0)
    zs = dict.fromkeys(measure.MOVES, 0.0)
    before = {"a": _snap(zero, zs), "b": _snap(zero, zs)}
    after = {"a": _snap({**zero, "device_to_host": 6e9, "host_to_device": 4e9},
                        {**zs, "device_to_host": 0.2, "host_to_device": 0.1}, wait=0.5),
             "b": _snap({**zero, "device_to_host": 2e9}, {**zs, "device_to_host": 0.2}, wait=0.25)}
    got = measure.spill_moves(before, after)
    assert got["moves"]["device_to_host"] == {"bytes": 8e9, "seconds": pytest.approx(0.4)}
    assert got["moves"]["host_to_device"] == {"bytes": 4e9, "seconds": pytest.approx(0.1)}
    assert got["restore_wait_s"] == pytest.approx(0.75) and got["workers"] == 2
    assert measure.resident_bytes(after) == {"device": 8, "host": 4, "disk": 6, "disk_stored": 2}
    counted = measure.spill_moves({"a": _snap(spilled={"device_to_host": 1})},
                                  {"a": _snap(spilled={"device_to_host": 11, "host_to_disk": 3})})
    assert counted["moves"]["device_to_host"] == {"bytes": 10, "seconds": None}
    assert counted["restore_wait_s"] is None and measure.resident_bytes({"a": _snap()}) is None

    # three runs: median bytes and seconds per run, GB/s over all the copying
    side = SideResult(runs_s=[1, 1, 1], spill=[got, got, {**got, "restore_wait_s": 2.0}])
    j = side.to_json()
    d2h = j["spill_moves"]["device_to_host"]
    assert d2h["bytes"] == 8e9 and d2h["gbps_per_worker"] == pytest.approx(20.0)
    assert j["spill_timed"] and j["restore_wait_s"] == pytest.approx(0.75)
    assert j["spill_moves"]["disk_to_host"]["gbps_per_worker"] is None


def test_spill_throughput_against_the_pinned_ceilings_and_its_target():
    from spillway_bench import report

    zero = dict.fromkeys(measure.MOVES, 0)
    moves = {"moves": {m: {"bytes": 0, "seconds": 0.0} for m in measure.MOVES}, "restore_wait_s": 0.3, "workers": 2}
    moves["moves"]["device_to_host"] = {"bytes": 40e9, "seconds": 1.0}   # 40 GB/s per worker
    moves["moves"]["host_to_device"] = {"bytes": 30e9, "seconds": 1.0}   # 30 GB/s
    moves["moves"]["host_to_disk"] = {"bytes": 5e9, "seconds": 2.0}
    persist = {"moves": {m: {"bytes": 0, "seconds": 0.0} for m in measure.MOVES}, "restore_wait_s": 0.0,
               "workers": 2}
    persist["moves"]["device_to_host"] = {"bytes": 20e9, "seconds": 0.5}
    sp = SideResult(runs_s=[1.0] * 3, bytes_spilled=[45e9] * 3, spill=[moves] * 3, persist_spill=[persist] * 3)
    base = SideResult(runs_s=[2.0] * 3, bytes_spilled=[50e9] * 3,
                      spill=[measure.spill_moves({"a": _snap(spilled=zero)}, {"a": _snap(spilled=zero)})] * 3)
    ceil = ceilings.Ceilings(gbps={"d2h_pinned": 50.0, "h2d_pinned": 50.0, "peer_copy": 300.0,
                                   "disk_write": 2.0, "disk_read": 4.0})
    entry = report.workload_entry(workloads.WORKLOADS["B2"], "tiny", {"spillway": sp, "baseline": base}, ceil)
    t = entry["spill_throughput"]
    assert t["device_to_host"]["ratio_to_ceiling"] == pytest.approx(0.8)
    assert t["host_to_device"]["ratio_to_ceiling"] == pytest.approx(0.6)
    # disk moves are read against the disk tier's ceilings, and stay out of the pinned target
    assert t["host_to_disk"]["ceiling"] == "disk_write" and t["host_to_disk"]["gbps_per_worker"] == pytest.approx(2.5)
    assert t["host_to_disk"]["ratio_to_ceiling"] == pytest.approx(1.25)  # the page cache passes it
    assert t["disk_to_host"]["ratio_to_ceiling"] is None  # nothing read back (and no time)
    assert entry["spill_ratio_to_pinned"] == pytest.approx(0.6)  # the lower of the two
    assert entry["restore_wait_s"] == pytest.approx(0.3)
    assert entry["baseline_spill_throughput"].startswith("not measured")
    spill_target = [x for x in report.targets([entry], "gpu") if "spill" in x["target"]]
    assert spill_target == [{"name": "B2", "target": "spill throughput >= 70% of the pinned ceiling",
                             "value": pytest.approx(0.6), "met": False}]
    assert [x["met"] for x in report.targets([entry], "cpu") if "spill" in x["target"]] == [None]
    # a workload that does not spill has no spill target
    entry_w1 = report.workload_entry(workloads.WORKLOADS["W1"], "tiny", {"spillway": SideResult(runs_s=[1.0])}, ceil)
    assert not [x for x in report.targets([entry_w1], "gpu") if "spill" in x["target"]]

    results = {"machine": {"name": "m", "gpus": [], "driver_version": None, "cuda_driver_version": None,
                           "workers": "gpu", "cpu": "c", "cores": 2, "memory_total": 2**30, "platform": "p",
                           "stack": {}},
               "started": "s", "finished": "f", "sizes": "tiny", "runs": 3, "clusters": {},
               "ceilings": ceil.gbps, "ceilings_skipped": {}, "ceiling_bytes": 1, "workloads": [entry],
               "targets": report.targets([entry], "gpu")}
    md = report.markdown(results)
    assert "## Spill throughput" in md
    assert "| B2 | spillway | device -> host | 37.25 GiB | 1.000 | 40.0 | 80% of d2h_pinned | 0.300 s |" in md
    assert "| B2 | spillway | host -> disk | 4.66 GiB | 2.000 | 2.5 | 125% of disk_write | 0.300 s |" in md
    assert "| B2 | baseline | 46.57 GiB spilled | — | — | — | — | not measured" in md
    assert "| B2 | spillway, persisting inputs | device -> host | 18.63 GiB | 0.500 | 40.0 | 80% of d2h_pinned | — |" in md
    assert entry["persist_spill_throughput"]["device_to_host"]["ratio_to_ceiling"] == pytest.approx(0.8)
    assert "| B2 | spill throughput >= 70% of the pinned ceiling | 60% | no |" in md


def test_a_run_counts_the_seconds_arena_pins_took_inside_its_window():
    def snap(pins):
        return {"store": {"host": {"arena_pins": pins}}}

    window = (100.0, 101.0)
    snapshots = {
        "a": snap([{"start": 99.0, "stop": 99.5, "bytes": 1},     # before the run
                   {"start": 99.8, "stop": 100.3, "bytes": 1},    # 0.3 s of it inside
                   {"start": 100.5, "stop": 100.6, "bytes": 1}]),  # 0.1 s
        "b": snap([{"start": 100.9, "stop": 102.0, "bytes": 1}]),  # 0.1 s, on the other worker
        "c": {"store": None},                                      # no tiered store
    }
    assert measure.arena_pin_overlap(snapshots, window) == pytest.approx(0.5)
    assert measure.arena_pin_overlap({"c": {"store": None}}, window) is None
    assert measure.arena_pin_overlap({"a": snap([])}, window) == 0.0


def _tiered(worker_local_directory=None, **kwargs):
    from numpy_codec import NumpyCodec
    from spillway.memory.disk import DiskTier
    from spillway.memory.store import TieredStore

    return TieredStore(codec=NumpyCodec(), below=[DiskTier(kwargs.pop("directory"))], **kwargs)


def test_timed_run_reads_spill_moves_from_real_tiered_stores(tmp_path):
    """CPU workers whose data is spillway's tiered store (NumPy in the device tier's
    place), small enough limits that W1's inputs go to host and disk."""
    from distributed import Client, LocalCluster

    # 8 MB device and 4 MB host per worker: however the 32 MB of inputs land on the two
    # workers, one of them holds more than 12 MB, so some must reach the disk
    store = (_tiered, {"device_limit": 8 * 2**20, "host_limit": 4 * 2**20, "directory": str(tmp_path)})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None, data=store) as cluster, Client(cluster) as client:
        client.register_plugin(clusters.SpillCounter(prefetch=False))
        w = workloads.WORKLOADS["W1"]
        m = measure.timed_run(client, w.direct(w.params("tiny"), "numpy", 3), kind="cpu", timeout=60,
                              keep_value=True)
        assert rel_error(m.value, _reference("W1", w.params("tiny"), 3)) <= 1e-10
        # 32 MB of inputs over two workers with 8 MB device and 8 MB host each
        assert m.persist_spill["moves"]["device_to_host"]["bytes"] > 0
        assert m.persist_spill["moves"]["host_to_disk"]["bytes"] > 0
        assert m.resident["disk"] > 0 and m.resident["device"] <= 2 * 8 * 2**20
        moves = m.spill["moves"]
        assert moves["disk_to_host"]["bytes"] > 0 and moves["disk_to_host"]["seconds"] > 0
        assert moves["host_to_device"]["bytes"] > 0 and moves["host_to_device"]["seconds"] > 0
        assert m.spill["restore_wait_s"] > 0
        del m
        assert measure.wait_released(client, timeout=30)


def _slow_check(y):
    import dask

    return [dask.delayed(time.sleep)(6, dask_key_name="slow-check")]


def test_a_check_that_never_returns_fails_its_side_within_the_timeout():
    """A run's check whose result does not reach the client in the run's timeout raises
    (the harness records the side as failed and goes on), where it hung the bench."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        w = workloads.WORKLOADS["W1"]
        began = time.perf_counter()
        with pytest.raises(TimeoutError):
            measure.timed_run(client, w.direct(w.params("tiny"), "numpy", 3), kind="cpu", timeout=2,
                              keep_value=True, check=_slow_check)
        assert time.perf_counter() - began < 5.5  # the timeout, not the check's 6 s


@pytest.mark.slow
def test_b3_tiny_runs_on_spillway_only_and_is_checked_against_numpy(tmp_path):
    result = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "B3", "--sizes", "tiny",
                                       "--no-ceilings", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    (b3,) = data["workloads"]
    assert b3["name"] == "B3" and b3["input_bytes"] == 2400 * 2400 * 8
    assert b3["spillway_s"] > 0 and b3["persist_s"] > 0 and b3["baseline_s"] is None and b3["speedup"] is None
    assert b3["baseline"]["skipped"].startswith("not run") and b3["baseline"]["runs_s"] == []
    assert len(b3["spillway"]["runs_s"]) == 3 and b3["spillway"]["warmup_s"] is None
    v = b3["verify"]
    assert v["ok"] and v["rel_error"] <= 1e-10 and v["seed"] == harness.SEED_BASE + 3
    x = uniform_numpy((2400, 2400), seed=v["seed"], dtype="float64")
    assert v["reference"] == pytest.approx((x + x.T).sum(), rel=1e-12)
    assert "baseline" not in data["clusters"]
    md = path.with_suffix(".md").read_text()
    assert "## Inputs over the tiers" in md and "| B3 |" in md and "OK: " in md
    assert "- B3 baseline: not run: plain LocalCUDACluster fails" in md
    assert "no baseline" in result.stdout
    # the value is logged before the reference is computed (which takes minutes at full size)
    log = path.with_suffix(".log").read_text()
    assert f"B3 spillway result    {v['value']!r} (seed {v['seed']})" in log


# --- the transfer-path steps: spillway alone, labelled runs, the link sweep


@pytest.mark.slow
def test_no_baseline_run_with_a_label_and_transfer_options_keeps_its_own_files(tmp_path):
    from matplotlib import image

    result = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "W1,B3", "--no-baseline",
                                       "--label", "step1", "--transfer-connections", "3",
                                       "--transfer-message-bytes", "64MB", "--out", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 4 and all(f.startswith("cpu-") and f.rsplit(".", 1)[0].endswith("-step1") for f in files)
    (path,) = tmp_path.glob("*-step1.json")
    data = json.loads(path.read_text())
    assert data["label"] == "step1" and data["baseline_run"] is False
    assert "baseline" not in data["clusters"]
    w1, b3 = data["workloads"]
    assert w1["baseline"]["skipped"] == w1["baseline_skipped"] == "skipped: --no-baseline"
    assert w1["baseline"]["runs_s"] == [] and w1["baseline_s"] is None and w1["speedup"] is None
    assert w1["spillway_s"] > 0 and len(w1["spillway"]["runs_s"]) == 3 and w1["bytes_moved"] > 0
    assert w1["baseline_spill_throughput"] is None
    assert b3["baseline_skipped"].startswith("not run")  # B3's own reason stays
    assert all(t["met"] is None for t in data["targets"])
    # the options reached the workers: read back on a worker of the cluster that ran
    spillway = data["clusters"]["spillway"]
    assert spillway["options"]["transfer-connections"] == 3
    assert spillway["worker_transfer"] == {"distributed.worker.connections.incoming": 3,
                                           "distributed.worker.connections.outgoing": 3,
                                           "distributed.worker.transfer.message-bytes-limit": 64_000_000}
    md = path.with_suffix(".md").read_text()
    assert "- label `step1`" in md and "- baseline not run (--no-baseline)" in md
    assert "- W1 baseline: skipped: --no-baseline" in md and "transfer-connections=3" in md
    assert image.imread(path.with_suffix(".png")).std() > 0.01
    table = result.stdout.strip().splitlines()[-3:]
    assert table[1].split()[0] == "W1" and "no baseline" in table[1]

    # a second step in the same second and directory does not overwrite the first
    again = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "W1", "--no-baseline",
                                      "--no-ceilings", "--label", "step2", "--out", str(tmp_path)],
                               catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert len(list(tmp_path.iterdir())) == 8
    (second,) = tmp_path.glob("*-step2.json")
    assert json.loads(second.read_text())["clusters"]["spillway"]["worker_transfer"][
        "distributed.worker.connections.incoming"] == 10  # unset: distributed's default


def test_link_sweep_on_cpu_measures_host_copy_at_each_size(tmp_path):
    from matplotlib import image

    result = CliRunner().invoke(main, ["bench", "--cpu", "--link-sweep", "--sweep-sizes", "4MB,1MB,4MB",
                                       "--label", "s2", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("cpu-*-link-s2.json")
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".md", ".png"]
    data = json.loads(path.read_text())
    assert data["what"] == "link sweep" and data["workers"] == "cpu" and data["label"] == "s2"
    assert data["message_bytes"] == [1_000_000, 4_000_000]  # sorted, once each
    assert list(data["gbps"]) == ["host_copy"] and all(v > 0.1 for v in data["gbps"]["host_copy"])
    assert data["skipped"] == {}
    md = path.with_suffix(".md").read_text()
    assert "| message | host_copy |" in md and "| 0.95 MiB | " in md and "| 3.81 MiB | " in md
    assert image.imread(path.with_suffix(".png")).std() > 0.01
    table = result.stdout.strip().splitlines()
    assert table[-3].split() == ["message", "host_copy"] and table[-1].startswith("3.81 MiB")


def test_link_sweep_records_every_gpu_measurement_and_why_one_is_missing(tmp_path):
    """The GPU path of the sweep, its files and plot, from given measurements."""
    from spillway_bench import link

    assert link.SWEEP_SIZES == tuple(n * 2**20 for n in (8, 32, 128, 256, 512, 1024, 2048))
    calls = []

    def measure(kind, devices, nbytes):
        calls.append((kind, devices, nbytes))
        gbps = {"hbm_copy": 4000.0, "peer_copy": 300.0, "peer_copy_0_to_1": 301.0, "peer_copy_1_to_0": 299.0,
                "h2d_pinned": 55.0, "d2h_pinned": 54.0}
        skipped = {}
        if nbytes == 2 * 2**30:
            skipped["ucxx_send_recv"] = "ucxx server did not start: exited with status 1: MemoryError"
        else:
            gbps["ucxx_send_recv"] = 100.0 * nbytes / 2**30
        return gbps, skipped

    plan = link.LinkSweep(kind="gpu", devices=(0, 1), inventory=Inventory(reason="test"), sizes=link.SWEEP_SIZES)
    results, paths = link.run_sweep(plan, tmp_path, stream=None, measure=measure)
    assert [c[2] for c in calls] == list(link.SWEEP_SIZES) and calls[0][:2] == ("gpu", (0, 1))
    assert list(results["gbps"]) == list(link.MEASURES["gpu"])
    assert results["gbps"]["peer_copy_1_to_0"] == [299.0] * 7
    assert results["gbps"]["ucxx_send_recv"][-1] is None
    assert results["gbps"]["ucxx_send_recv"][-2] == pytest.approx(100.0)
    assert results["skipped"] == {"ucxx_send_recv": {str(2 * 2**30): "ucxx server did not start: exited with "
                                                                      "status 1: MemoryError"}}
    assert paths["json"].name.endswith("-link.json") and json.loads(paths["json"].read_text()) == results
    md = paths["md"].read_text()
    assert "| 2.00 GiB | 301.0 | 299.0 | — | 55.0 | 54.0 |" in md
    assert "- ucxx_send_recv at 2.00 GiB: ucxx server did not start" in md
    assert paths["png"].stat().st_size > 10_000
    assert link.short_table(results).splitlines()[1].split() == ["8.00", "MiB", "301.0", "299.0", "0.8", "55.0", "54.0"]


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_link_sweep_on_the_gpus(tmp_path, gpu_count):
    result = CliRunner().invoke(main, ["bench", "--link-sweep", "--sweep-sizes", "8MiB,256MiB",
                                       "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*-link.json")
    data = json.loads(path.read_text())
    assert data["workers"] == "gpu" and data["message_bytes"] == [8 * 2**20, 256 * 2**20]
    for name in ("h2d_pinned", "d2h_pinned"):
        assert all(v > 1 for v in data["gbps"][name]), data["skipped"]
    if gpu_count >= 2:
        for name in ("peer_copy_0_to_1", "peer_copy_1_to_0", "ucxx_send_recv"):
            assert all(v > 1 for v in data["gbps"][name]), data["skipped"]
        # a larger message does not move slower over the peer copy
        assert data["gbps"]["peer_copy_0_to_1"][1] > 0.8 * data["gbps"]["peer_copy_0_to_1"][0]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_step1_on_gpus_reaches_the_gpu_workers_without_a_baseline(tmp_path, gpu_count):
    result = CliRunner().invoke(main, ["bench", "--only", "W1", "--sizes", "small", "--no-baseline",
                                       "--label", "step1", "--transfer-connections", "4",
                                       "--transfer-message-bytes", "1GB", "--out", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*-step1.json")
    data = json.loads(path.read_text())
    assert data["clusters"]["spillway"]["kind"] == "gpu" and "baseline" not in data["clusters"]
    assert data["clusters"]["spillway"]["worker_transfer"] == {
        "distributed.worker.connections.incoming": 4, "distributed.worker.connections.outgoing": 4,
        "distributed.worker.transfer.message-bytes-limit": 1_000_000_000}
    (w1,) = data["workloads"]
    assert w1["spillway_s"] > 0 and w1["speedup"] is None and w1["baseline_skipped"] == "skipped: --no-baseline"
    if gpu_count >= 2:
        assert w1["transfer_gbps_median"] > 0


# --- B4 and B5: against the baseline, checked against NumPy float64


def test_references_from_the_seed_match_numpy():
    from spillway_bench import reference

    x = uniform_numpy((900, 700), seed=5)
    y = uniform_numpy((700, 900), seed=5, stream=1)
    assert reference.matmul_sum((900, 700), 5, processes=2) == pytest.approx((x @ y).sum(), rel=1e-13)
    assert reference.array_sum((900, 700), 5, processes=1) == pytest.approx(x.sum(), rel=1e-13)
    assert reference.array_sum((700, 900), 5, stream=1, processes=1) == pytest.approx(y.sum(), rel=1e-13)
    b = uniform_numpy((900,), seed=5, stream=1)
    stats = reference.panel_stats((900, 700), 5, wanted=("sumsq", "colsum", "rowsum", "gram", "xtb"),
                                  processes=2)
    assert stats["sumsq"] == pytest.approx((x * x).sum(), rel=1e-13)
    np.testing.assert_allclose(stats["colsum"], x.sum(axis=0), rtol=1e-13)
    np.testing.assert_allclose(stats["rowsum"], x.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(stats["gram"], x.T @ x, rtol=1e-12)
    np.testing.assert_allclose(stats["xtb"], x.T @ b, rtol=1e-12)
    # panels smaller than the array: the sum is the same however it is cut
    from unittest import mock

    with mock.patch.object(reference, "PANEL_BYTES", 64 * 700 * 8):
        assert reference.array_sum((900, 700), 5, processes=1) == pytest.approx(x.sum(), rel=1e-13)
        np.testing.assert_allclose(reference.gram((900, 700), 5, processes=1), x.T @ x, rtol=1e-12)
    with pytest.raises(ValueError, match="unknown statistics"):
        reference.panel_stats((4, 4), 1, wanted=("max",))


@pytest.mark.parametrize("name", ["B4", "B5"])
def test_b4_and_b5_build_the_same_value_on_both_sides_and_match_numpy(name):
    w = workloads.WORKLOADS[name]
    p = w.params("tiny")
    x = uniform_numpy(p["shape"], seed=7)
    expected = (x @ uniform_numpy(p["shape"], seed=7, stream=1)).sum() if name == "B4" else x.sum()
    assert w.reference(p, 7) == pytest.approx(expected, rel=1e-13)
    target = Target(kind="cpu", n_workers=2)
    spillway = w.build("tiny", target, 7)
    baseline = w.build("tiny", target, 7, side="baseline")
    # spillway's side is the registered workflow, then .sum()
    assert spillway.source == f"workflow {w.workflow}" and spillway.note is None
    for built in (spillway, baseline):
        assert built.result.shape == ()
        # dask's default scheduler: a distributed client left as the default by an earlier
        # test makes dask's default rechunk P2P, which runs only on that client
        assert abs(built.result.compute() - expected) / abs(expected) <= 1e-12
    if name == "B5":
        # the baseline is what a user writes: dask's default rechunk method, no method= given
        assert baseline.source == "direct (baseline: user code)"
        # spillway's rechunk workflow is the exchange: one step (no cluster: one step does
        # it all) and a getter a panel; the pieces' tasks where a client an earlier test left
        # as the default is about (a cluster without the steps' plugin)
        keys = list(spillway.result.__dask_graph__())
        assert any(str(k[0]).startswith(("spillway-step-", "spillway-cut-")) for k in keys)
        assert not any(str(k[0]).startswith("rechunk-merge") for k in keys)


def test_b4_and_b5_sizes_and_targets():
    b4, b5 = workloads.WORKLOADS["B4"], workloads.WORKLOADS["B5"]
    # the nominal full sizes, used where there is no GPU to size them from
    assert b4.params("full")["shape"] == (100000, 100000) and b4.input_bytes("full") == 160_000_000_000
    assert b5.params("full")["shape"] == (158113, 158113)
    assert b5.params("full")["chunks"] == (1000, 158113) and b5.params("full")["to_chunks"] == (158113, 1000)
    assert 199.9e9 < b5.input_bytes("full") < 200.1e9
    assert b4.for_machine(None) is b4 and b4.sized_from is None
    assert b4.speedup_target == 1.5 and workloads.WORKLOADS["B2"].speedup_target == 5.0
    assert b5.baseline_expected_failure and "out of device memory" in b4.baseline_expected_failure
    assert b4.timed_runs("full", 3) == b5.timed_runs("full", 3) == 1 and b4.timed_runs("small", 3) == 3
    assert [w.name for w in workloads.select(None)] == DEFAULT  # named with --only, like B3
    # small and tiny stay fixed for tests and CI
    assert b4.for_machine(85 * 10**9).params("tiny") == b4.params("tiny")
    assert b5.for_machine(85 * 10**9).params("small") == b5.params("small")


H100 = 85_520_809_984  # NVML's memory_total of an H100 80 GB


@pytest.mark.parametrize("gpu_bytes, b4_side, b5_side", [
    (H100, 84000, 118000),           # one H100 80 GB
    (4 * 141 * 10**9, 215000, 303000),  # four H200
])
def test_b4_and_b5_at_full_size_hold_1_3x_the_gpus_memory(gpu_bytes, b4_side, b5_side):
    b4 = workloads.WORKLOADS["B4"].for_machine(gpu_bytes)
    b5 = workloads.WORKLOADS["B5"].for_machine(gpu_bytes)
    assert b4.params("full")["shape"] == (b4_side, b4_side) and b4.params("full")["chunks"] == (10000, 10000)
    assert b5.params("full")["shape"] == (b5_side, b5_side)
    assert b5.params("full")["chunks"] == (1000, b5_side) and b5.params("full")["to_chunks"] == (b5_side, 1000)
    for w in (b4, b5):
        # x and y together (B4), the array (B5): 1.3x, up to the rounding of a side to 1000
        assert 1.3 * gpu_bytes <= w.input_bytes("full") <= 1.33 * gpu_bytes
        assert w.sized_from == gpu_bytes and "x the GPUs'" in w.describe("full")
    # the reference is read off the sized parameters: B4's shortcut at B4's shape
    assert b4.params("full")["array_shape"] == (b4_side, b4_side)


def test_prepare_sizes_b4_and_b5_from_the_gpus_of_the_run(monkeypatch):
    import dataclasses

    import spillway_bench.suite
    from spillway.launch.plan import plan as launch_plan
    from tests.helpers.stand_ins import h200_host

    # GPU workers on the stand-in host, as where dask-cuda and CuPy are installed
    monkeypatch.setattr(spillway_bench.suite, "launch_plan",
                        lambda options, inventory, host: launch_plan(
                            options, inventory, dataclasses.replace(host, have_cuda_stack=True, have_ucxx=False)))
    one = prepare(Options.resolve(), only="B4,B5,B2", sizes="full", inventory=h200_host(1))
    two = prepare(Options.resolve(), only="B4,B5", sizes="full", inventory=h200_host(2))
    b2, b4, b5 = one.workloads
    assert b4.sized_from == 141 * 10**9 and b4.params("full")["shape"] == (108000, 108000)
    assert b5.params("full")["shape"] == (152000, 152000)
    assert b2.params("full") == workloads.WORKLOADS["B2"].params("full")  # B2 keeps its definition
    assert [w.sized_from for w in two.workloads] == [282 * 10**9] * 2
    assert two.workloads[0].input_bytes("full") > 1.9 * b4.input_bytes("full")
    # CPU workers: nothing to size from
    cpu = prepare(Options.resolve(cpu=True, n_workers=2), only="B4", sizes="tiny", inventory=Inventory(reason="t"))
    assert cpu.workloads[0].sized_from is None


def test_b3_small_puts_the_same_few_gb_on_each_workers_disk(monkeypatch):
    import dataclasses

    import spillway_bench.suite
    from spillway.launch.plan import plan as launch_plan
    from tests.helpers.stand_ins import h200_host

    monkeypatch.setattr(spillway_bench.suite, "launch_plan",
                        lambda options, inventory, host: launch_plan(
                            options, inventory, dataclasses.replace(host, have_cuda_stack=True, have_ucxx=False)))
    (one,) = prepare(Options.resolve(), only="B3", sizes="small", inventory=h200_host(1)).workloads
    (two,) = prepare(Options.resolve(), only="B3", sizes="small", inventory=h200_host(2)).workloads
    assert two.params("small")["shape"] == (120000, 120000)  # as measured on 2 x H200
    assert one.params("small")["shape"] == (85000, 85000)
    # each worker: past its 30 GB device limit and 20 GB host tier, by less than 10 GB of disk
    for workload, workers in ((one, 1), (two, 2)):
        per_worker = workload.input_bytes("small") / workers
        assert 50e9 < per_worker < 60e9
    # CPU workers keep the nominal size
    cpu = prepare(Options.resolve(cpu=True, n_workers=2), only="B3", sizes="tiny", inventory=Inventory(reason="t"))
    assert cpu.workloads[0].params("small")["shape"] == (120000, 120000)


def test_copy_bound_adds_each_way_over_the_rates_of_the_run():
    from spillway_bench import bounds

    gbps = {"d2h_pinned": 50.0, "h2d_pinned": 40.0, "disk_write": 1.0, "disk_read": 2.0}
    moves = {"device_to_host": 100 * 10**9, "host_to_device": 80 * 10**9, "host_to_disk": 3 * 10**9,
             "disk_to_host": 4 * 10**9}
    one = bounds.copy_bound(moves, gbps, 1)
    assert one["bound_s"] == pytest.approx(2.0 + 2.0 + 3.0 + 2.0)
    assert one["moves"]["host_to_device"] == {"bytes": 80 * 10**9, "ceiling": "h2d_pinned", "ceiling_gbps": 40.0,
                                              "seconds": pytest.approx(2.0)}
    # two GPUs: a host link each; one disk
    assert bounds.copy_bound(moves, gbps, 2)["bound_s"] == pytest.approx(1.0 + 1.0 + 3.0 + 2.0)
    timed = bounds.with_time(one, 18.0)
    assert timed["ratio"] == pytest.approx(2.0) and timed["time_s"] == 18.0
    # a move without its rate: no bound, and which rate is missing
    partial = bounds.copy_bound(moves, {"d2h_pinned": 50.0, "h2d_pinned": 40.0}, 1)
    assert partial["bound_s"] is None and partial["missing"] == ["disk_write", "disk_read"]
    assert bounds.with_time(partial, 5.0)["ratio"] is None
    # nothing moved: a zero bound, no ratio
    nothing = bounds.with_time(bounds.copy_bound({"device_to_host": 0}, gbps, 1), 1.0)
    assert nothing["bound_s"] == 0 and nothing["ratio"] is None
    per_worker = {"w1": {"moves": {"device_to_host": {"bytes": 5}}}, "w2": {"moves": {"device_to_host": {"bytes": 7},
                                                                                    "host_to_device": {"bytes": 1}}}}
    assert bounds.summed_moves(per_worker) == {"device_to_host": 12, "host_to_device": 1}


def _moves(d2h, h2d, disk_w=0, disk_r=0):
    values = {"device_to_host": d2h, "host_to_device": h2d, "host_to_disk": disk_w, "disk_to_host": disk_r}
    return {"moves": {m: {"bytes": b, "seconds": b / 40e9 if b else 0.0} for m, b in values.items()},
            "restore_wait_s": 0.1, "spill_producer_wait_s": 0.0, "workers": 1}


def test_the_report_puts_the_copy_bound_next_to_the_time():
    from spillway_bench import report

    ceil = ceilings.Ceilings(gbps={"d2h_pinned": 50.0, "h2d_pinned": 50.0, "disk_write": 1.0, "disk_read": 2.0})
    sp = SideResult(source="direct", runs_s=[4.0], spill=[_moves(100 * 10**9, 50 * 10**9, 1 * 10**9, 2 * 10**9)])
    base = SideResult(source="direct", runs_s=[20.0], spill=[_moves(100 * 10**9, 100 * 10**9)])
    b2 = workloads.WORKLOADS["B2"]
    entry = report.workload_entry(b2, "tiny", {"spillway": sp, "baseline": base}, ceil, n_workers=1)
    # 2 s + 1 s of pinned copies, 1 s of disk writes, 1 s of disk reads
    assert entry["copy_bound_s"] == pytest.approx(5.0)
    assert entry["time_over_copy_bound"] == pytest.approx(0.8)
    assert entry["baseline_copy_bound"]["bound_s"] == pytest.approx(4.0)
    assert entry["baseline_copy_bound"]["ratio"] == pytest.approx(5.0)
    in_core = report.workload_entry(workloads.WORKLOADS["W1"], "tiny",
                                    {"spillway": SideResult(runs_s=[1.0], spill=[_moves(0, 0)])}, ceil)
    assert in_core["copy_bound"] is None and in_core["time_over_copy_bound"] is None
    results = {"machine": {"name": "m", "gpus": [], "workers": "gpu", "driver_version": None,
                           "cuda_driver_version": None, "cpu": "c", "cores": 1, "memory_total": 1,
                           "platform": "p", "stack": {}},
               "started": "s", "finished": "f", "sizes": "tiny", "runs": 3, "clusters": {}, "ceilings": ceil.gbps,
               "ceilings_skipped": {}, "ceiling_bytes": 1, "workloads": [entry, in_core], "targets": []}
    md = report.markdown(results)
    assert "## Copy bound" in md
    (line,) = [x for x in md.splitlines() if x.startswith("| B2 | ") and "x bound" not in x and "0.8x" in x]
    assert "| 5.000 | 4.000 | 0.8x | 4.000 | 20.000 | 5.0x |" in line
    short = report.short_table(results)
    assert "x bound" in short.splitlines()[0] and short.splitlines()[1].rstrip().endswith("0.8x")


def _p2p_fails(p, backend, seed):
    import dask.array as da

    def transfer(block):
        raise RuntimeError("P2P 1234abcd failed during transfer phase")

    x = random.uniform(p["shape"], p["chunks"], seed=seed, dtype=p["dtype"], backend=backend)
    return da.map_blocks(transfer, x.rechunk(p["to_chunks"]), dtype=p["dtype"]).sum()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_b4_b5_b2_on_cpu_clusters_check_numpy_and_record_a_failing_baseline(tmp_path, monkeypatch):
    """The bench command on real CPU clusters: B4 and B5 checked against NumPy on both
    sides, B5's baseline failing the way plain dask-cuda's did (recorded with its error,
    the bench still succeeds), and every target printed with whether it was met."""
    import dataclasses

    failing = dataclasses.replace(workloads.WORKLOADS["B5"], baseline_direct=_p2p_fails)
    monkeypatch.setitem(workloads.WORKLOADS, "B5", failing)
    result = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "B4,B5,B2", "--sizes", "tiny",
                                       "--no-ceilings", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    b2, b4, b5 = data["workloads"]
    assert [b2["name"], b4["name"], b5["name"]] == ["B2", "B4", "B5"]
    for w in (b4, b5):
        assert w["verify"]["ok"] and w["verify"]["rel_error"] <= 1e-10
        assert w["verify"]["seed"] == harness.SEED_BASE + 3 and w["spillway"]["error"] is None
    x = uniform_numpy((1200, 1200), seed=harness.SEED_BASE + 3)
    y = uniform_numpy((1200, 1200), seed=harness.SEED_BASE + 3, stream=1)
    assert b4["verify"]["reference"] == pytest.approx((x @ y).sum(), rel=1e-12)
    # B4's baseline ran the same graph and was checked too
    assert b4["baseline_verify"]["ok"] and b4["speedup"] == pytest.approx(b4["baseline_s"] / b4["spillway_s"])
    # B5's baseline: failed, with its error, as expected; no time, no speedup
    base = b5["baseline"]
    assert base["error"] == "RuntimeError: P2P 1234abcd failed during transfer phase"
    assert base["expected_failure"].startswith("plain dask-cuda with dask's default (P2P) rechunk failed")
    assert b5["baseline_error"] == base["error"] and b5["baseline_s"] is None and b5["speedup"] is None
    assert base["source"] == "" and base["runs_s"] == []
    targets = {(t["name"], t["target"]): t for t in data["targets"]}
    done = targets[("B5", "spillway completes with NumPy's answer where the baseline fails")]
    assert done["met"] is True and done["baseline"].startswith("failed: RuntimeError: P2P")
    # speed targets are the GPU host's: listed, not judged on CPU workers
    assert targets[("B4", "at least 1.5x faster than the baseline")]["met"] is None
    assert targets[("B2", "at least 5x faster than the baseline")]["met"] is None
    md = path.with_suffix(".md").read_text()
    assert "| B4 | at least 1.5x faster than the baseline | " in md
    assert "| B5 | spillway completes with NumPy's answer where the baseline fails | relative error " in md
    assert "- B5 baseline: failed: RuntimeError: P2P 1234abcd failed during transfer phase (expected: " in md
    out = result.stdout + result.stderr
    assert "target B2: at least 5x faster than the baseline: " in out
    assert "target B5: spillway completes with NumPy's answer where the baseline fails: " in out
    (line,) = [x for x in out.splitlines() if x.startswith("target B5: spillway completes")]
    assert line.endswith(": yes") and "baseline failed: RuntimeError: P2P" in line
    row = [r for r in result.stdout.strip().splitlines() if r.startswith("B5 ")]
    assert row and "baseline failed (expected)" in row[0]
    assert "failed workloads" not in out


def test_a_spillway_failure_still_fails_the_bench_when_the_baseline_was_expected_to_fail():
    from spillway_bench import report

    results = {"workloads": [{"name": "B5", "spillway": {"error": "boom"},
                              "baseline": {"error": "P2P", "expected_failure": "known"}},
                             {"name": "B4", "spillway": {"error": None}, "baseline": {"error": "x"}},
                             {"name": "B2", "spillway": {}, "baseline": {"error": "P2P", "expected_failure": "k"}}]}
    assert report.failed_workloads(results) == ["B5", "B4"]


def test_each_w_workload_has_a_compute_and_a_copy_bound():
    from spillway_bench import bounds
    from spillway_bench.workloads.standard import STANDARD

    gbps = {"fp64_gemm_tflops": 50.0, "hbm_copy": 3000.0, "peer_copy": 400.0}
    by_name = {w.name: w for w in STANDARD}
    for name in ("W1", "W2", "W3", "W4", "W5"):
        assert by_name[name].work is not None, name
    # matmul 20000^3 * 2 flops over two GPUs at 50 TFLOP/s: 0.16 s, its memory far less
    w2 = bounds.bound(by_name["W2"].work(by_name["W2"].params("full")), 8 * 10**9, None, gbps, 2, 0.32)
    assert w2["compute"]["flops_s"] == pytest.approx(2 * 20000**3 / (50e12 * 2))
    assert w2["bound_s"] == pytest.approx(0.16) and w2["ratio"] == pytest.approx(2.0)
    assert w2["transfer_s"] == pytest.approx(8e9 / (400e9 * 2))
    # W3 reads and writes its 51.2 GB once: 102.4 GB at 3 TB/s over two GPUs; 25.6 GB between them
    w3 = bounds.bound(by_name["W3"].work(by_name["W3"].params("full")), 25.6 * 10**9, 0.5, gbps, 2, 1.0)
    assert w3["compute"]["hbm_s"] == pytest.approx(2 * 80000**2 * 8 / (3000e9 * 2))
    assert w3["copy_s"] == pytest.approx(25.6e9 / 800e9 + 0.5)  # spills add to the copies
    assert w3["bound_s"] == pytest.approx(w3["copy_s"])
    # a missing ceiling leaves that bound unknown, never zero
    assert bounds.bound(by_name["W2"].work(by_name["W2"].params("full")), 0, None, {}, 2, 1.0)["bound_s"] is None
