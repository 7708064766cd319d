"""O3 and O4, the out-of-core rows of ``spillway bench``: their sizes past the GPUs'
memory, the user code they run and its checks against NumPy float64, the three sides on
clusters of their own with the first run recorded, and a tiny run on CPU clusters."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from reference_inputs import uniform_numpy
from stand_ins import OtherSession
from spillway_bench import harness, prepare, report, workloads
from spillway_bench.sides import SIDES
from spillway.cli import main
from spillway.options.gpus import Inventory
from spillway.options.settings import Options
from spillway.workflows import random
from spillway.workflows.params import Target

O_ROWS = ("O3", "O4")

# --- sizes: the footprint, input and output together, past the GPUs' memory


#: the side of the square array at full size, by row, GPUs and bytes of each GPU: the
#: footprint (2 x n^2 x 8 bytes for O3, 2 x n^2 x 16 for O4) at 2.5x one GPU's memory or
#: 1.5x the memory of several, the side rounded up to the next 1000
SIDE = {
    ("O3", 1, 80 * 10**9): 112000, ("O3", 2, 80 * 10**9): 123000, ("O3", 4, 80 * 10**9): 174000,
    ("O3", 1, 141 * 10**9): 149000, ("O3", 2, 141 * 10**9): 163000, ("O3", 4, 141 * 10**9): 230000,
    ("O4", 1, 80 * 10**9): 80000, ("O4", 2, 80 * 10**9): 87000, ("O4", 4, 80 * 10**9): 123000,
    ("O4", 1, 141 * 10**9): 105000, ("O4", 2, 141 * 10**9): 115000, ("O4", 4, 141 * 10**9): 163000,
}


@pytest.mark.parametrize("name", O_ROWS)
@pytest.mark.parametrize("gpus", [1, 2, 4])
@pytest.mark.parametrize("per_gpu", [80 * 10**9, 141 * 10**9])
def test_full_size_footprint_is_2_5x_one_gpu_and_1_5x_several(name, gpus, per_gpu):
    total = gpus * per_gpu
    w = workloads.WORKLOADS[name].for_machine(total, gpus, gpus)
    factor = 2.5 if gpus == 1 else 1.5
    p = w.params("full")
    n = p["shape"][0]
    assert p["shape"] == (n, n) and n == SIDE[(name, gpus, per_gpu)]
    itemsize = 8 if name == "O3" else 16
    assert w.input_bytes("full") == n * n * itemsize
    # input and output held together
    assert w.footprint_bytes("full") == 2 * n * n * itemsize
    # at least the factor, and no more than the rounding of the side to 1000 adds
    assert factor * total <= w.footprint_bytes("full") < factor * total * (n / (n - 1000)) ** 2
    assert w.sized_from == total and w.sized_for_gpus == gpus
    assert f"(footprint {w.footprint_bytes('full') / total:.2f}x the GPUs' " in w.describe("full")
    if name == "O3":
        assert p["chunks"] == (1000, n) and p["to_chunks"] == (n, 1000) and p["dtype"] == "float64"
    else:
        assert p["chunks"] == (5000, 5000) and p["panel"] == 1000 and p["dtype"] == "complex128"
    # small and tiny stay as defined, whatever the machine
    for scale in ("small", "tiny"):
        assert w.params(scale) == workloads.WORKLOADS[name].params(scale)


def test_prepare_sizes_the_o_rows_from_the_gpus_of_the_run(monkeypatch):
    import spillway_bench.suite
    from spillway.launch.plan import plan as launch_plan
    from tests.helpers.stand_ins import h200_host

    monkeypatch.setattr(spillway_bench.suite, "launch_plan",
                        lambda options, inventory, host: launch_plan(
                            options, inventory, dataclasses.replace(host, have_cuda_stack=True, have_ucxx=False)))
    # a host with room for 2.5x (this machine's own memory would cap it)
    monkeypatch.setattr(spillway_bench.suite, "_host_bytes", lambda: 2 * 2**40)
    one = prepare(Options.resolve(), only="O3,O4", sizes="full", inventory=h200_host(1))
    # two workers of one GPU: still one GPU's memory, 2.5x of it
    shared = prepare(Options.resolve(workers_per_gpu=2), only="O3", sizes="full", inventory=h200_host(1))
    two = prepare(Options.resolve(), only="O3,O4", sizes="full", inventory=h200_host(2))
    assert [w.params("full")["shape"][0] for w in one.workloads] == [149000, 105000]
    assert shared.workloads[0].params("full")["shape"][0] == 149000 and shared.launch.n_workers == 2
    assert [w.params("full")["shape"][0] for w in two.workloads] == [163000, 115000]
    assert [w.sized_for_gpus for w in two.workloads] == [2, 2]
    cpu = prepare(Options.resolve(cpu=True, n_workers=2), only="O3", sizes="tiny", inventory=Inventory(reason="t"))
    assert cpu.workloads[0].sized_from is None
    # one H200 on its 128 GiB host: the footprint the GPU and three quarters of the host
    monkeypatch.setattr(spillway_bench.suite, "_host_bytes", lambda: 128 * 2**30)
    small_host = prepare(Options.resolve(), only="O3", sizes="full", inventory=h200_host(1))
    assert small_host.workloads[0].params("full")["shape"][0] < 149000


def test_o_rows_are_in_the_default_set_after_the_in_memory_rows():
    assert [w.name for w in workloads.select(None)] == ["W1", "W2", "W3", "W4", "W5", "O3", "O4", "O5", "B1", "B2"]
    for name in (*O_ROWS, "O5"):
        w = workloads.WORKLOADS[name]
        assert w.sides == ("spillway", "tasks_method", "baseline") and w.fresh_cluster and w.user_code
        assert w.baseline_expected_failure and w.baseline_direct is None and w.check is not None


# --- the user code and its checks against NumPy float64


def _complex(shape, seed):
    loc = tuple((0, s) for s in shape)
    return (random.uniform_block(seed, 0, shape, loc, "float64", "numpy")
            + 1j * random.uniform_block(seed, 1, shape, loc, "float64", "numpy"))


def test_o3_is_the_users_rechunk_and_its_check_matches_numpy():
    import dask

    w = workloads.WORKLOADS["O3"]
    p = w.params("tiny")
    y = w.build("tiny", Target(kind="cpu", n_workers=2), 7).result
    assert y.chunks[0] == (p["shape"][0],) and set(y.chunks[1]) == {p["panel"]}
    x = uniform_numpy(p["shape"], seed=7)
    np.testing.assert_array_equal(y.compute(scheduler="sync"), x)
    colsum, rowsum = w.reference(p, 7)
    assert np.abs(colsum - x.sum(axis=0)).max() <= 1e-12 * np.abs(colsum).max()
    assert np.abs(rowsum - x.sum(axis=1)).max() <= 1e-12 * np.abs(rowsum).max()
    computed = dask.compute(*w.check(y), scheduler="sync")
    for c, r in zip(computed, (colsum, rowsum)):
        assert np.linalg.norm(c - r) / np.linalg.norm(r) <= 1e-13
    # a value in the wrong column changes the column sums: the check would see it
    swapped = x.copy()
    swapped[:, [0, 1]] = swapped[:, [1, 0]]
    assert np.linalg.norm(swapped.sum(axis=0) - colsum) / np.linalg.norm(colsum) > 1e-6


def test_o4_is_the_users_fft_and_its_check_matches_numpy():
    import dask

    w = workloads.WORKLOADS["O4"]
    p = w.params("tiny")
    big = w.build("tiny", Target(kind="cpu", n_workers=2), 9).result
    assert big.chunks[0] == (p["shape"][0],) and set(big.chunks[1]) == {p["panel"]}
    expected = np.fft.fft(_complex(p["shape"], 9), axis=0)
    got = big.compute(scheduler="sync")
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-12
    row0, energy = w.reference(p, 9)
    # row 0 is the column sums of x; each column's energy is n times x's (Parseval)
    assert np.linalg.norm(row0 - expected[0, :]) / np.linalg.norm(row0) <= 1e-13
    np.testing.assert_allclose(energy, (np.abs(expected) ** 2).sum(axis=0), rtol=1e-12)
    computed = dask.compute(*w.check(big), scheduler="sync")
    for c, r in zip(computed, (row0, energy)):
        assert np.linalg.norm(c - r) / np.linalg.norm(r) <= 1e-13


@pytest.mark.parametrize("gpus", [1, 2, 4])
@pytest.mark.parametrize("per_gpu", [80 * 10**9, 141 * 10**9])
def test_o5_full_size_is_1_3x_the_gpus_in_512_cubes_within_the_host(gpus, per_gpu):
    total = gpus * per_gpu
    w = workloads.WORKLOADS["O5"].for_machine(total, gpus, gpus)
    p = w.params("full")
    n = p["shape"][0]
    assert p["shape"] == (n,) * 3 and p["chunks"] == (512,) * 3 and p["dtype"] == "float32" and n % 64 == 0
    # input and output held together, at 1.3x less the rounding of the side down to 64
    assert 1.3 * total * ((n / (n + 64)) ** 3) < w.footprint_bytes("full") == 2 * 4 * n**3 <= 1.3 * total
    # one GPU on a 128 GiB host: 1.3x still fits the host's share, so the host leaves it as it
    # is; four H200s on it do not (their 0.3x past the GPUs would be 169 GB on the host)
    capped = workloads.WORKLOADS["O5"].for_machine(total, gpus, gpus, 128 * 2**30)
    if gpus == 1:
        assert capped.params("full") == p
    else:
        assert capped.footprint_bytes("full") <= total + 0.75 * 128 * 2**30


def test_o5_is_the_users_map_overlap_and_its_check_matches_numpy():
    import dask

    w = workloads.WORKLOADS["O5"]
    p = w.params("tiny")
    y = w.build("tiny", Target(kind="cpu", n_workers=2), 5).result
    assert y.shape == p["out_shape"] and y.chunks == tuple((32,) * 3 for _ in range(3))
    x = random.uniform_block(5, 0, p["shape"], tuple((0, n) for n in p["shape"]), "float32", "numpy")
    # the filter with a zero boundary, in float64 over the same float32 values
    padded = np.pad(x.astype(np.float64), 1)
    core = tuple(slice(1, -1) for _ in range(3))
    expected = -6 * padded[core]
    for axis in range(3):
        for step in (-1, 1):
            expected += np.roll(padded, step, axis=axis)[core]
    got = y.compute(scheduler="sync")
    assert np.abs(got - expected).max() <= 1e-5
    (planes,) = w.reference(p, 5)
    np.testing.assert_allclose(planes, expected.sum(axis=(1, 2)), rtol=1e-10, atol=1e-9)
    (computed,) = dask.compute(*w.check(y), scheduler="sync")
    assert np.linalg.norm(computed - planes) / np.linalg.norm(planes) <= w.tolerance
    # a halo face left out (zeros where a neighbour chunk's face belongs) changes the sums
    # of the planes beside that chunk boundary: the check would see it
    missing = expected.copy()
    missing[31] -= x[32].astype(np.float64)
    assert np.linalg.norm(missing.sum(axis=(1, 2)) - planes) / np.linalg.norm(planes) > 100 * w.tolerance


def test_o5_tasks_method_builds_dask_own_halos_inside_a_spillway_session():
    from spillway.datapath.collective import method

    w = workloads.WORKLOADS["O5"]
    target = Target(kind="cpu", n_workers=2)
    # as if a spillway cluster's client were the default: the route is in place
    session = OtherSession("tcp://127.0.0.1:1")
    method.use_on(session)
    try:
        from unittest import mock

        with mock.patch.object(method, "_on_spillway", return_value=True):
            spillway_side = w.build("tiny", target, 3, side="spillway").result
            tasks_side = w.build("tiny", target, 3, side="tasks_method").result
    finally:
        method.stop_using(session)
    names = lambda a: {str(n).split("-")[0] for n in a.__dask_graph__().layers}
    # the step without a cluster; the pieces' tasks where a client an earlier test left as
    # the default is about (a cluster without the steps' plugin)
    assert workloads.expressions.rechunk_method(spillway_side) in ("step", "collective")
    assert workloads.expressions.rechunk_method(tasks_side) is None and "overlap" in " ".join(
        str(n) for n in tasks_side.__dask_graph__().layers), names(tasks_side)
    np.testing.assert_array_equal(spillway_side.compute(scheduler="sync"), tasks_side.compute(scheduler="sync"))


def test_each_side_builds_the_same_code_under_its_own_rechunk_method():
    import dask

    w = workloads.WORKLOADS["O3"]
    target = Target(kind="cpu", n_workers=2)
    methods = {}
    for side in w.sides:
        with dask.config.set(SIDES[side].build_config(dask.config.config)):
            built = w.build("tiny", target, 3, side=side)
        methods[side] = workloads.expressions.rechunk_method(built.result)
    # spillway's side takes P2P whatever the graph's size, which is the collective itself
    # where a spillway cluster's client is the default (a session an earlier test of this
    # process left open); tasks_method the task-based method; the baseline leaves it to dask
    # (which picks P2P here only where such a client is still the default)
    assert methods["spillway"] in ("p2p", "collective") and methods["tasks_method"] == "tasks"
    assert SIDES["baseline"].build_config(dask.config.config) == {} and methods["baseline"] in ("tasks", "p2p", "collective")
    # a method the user chose is kept on spillway's side
    with dask.config.set({"array.rechunk.method": "tasks"}):
        assert SIDES["spillway"].build_config(dask.config.config) == {}


# --- the harness: a cluster per side, the first run recorded


def test_each_o_row_gets_its_own_cluster_on_each_of_its_three_sides():
    from spillway.launch import LaunchPlan

    gpu = LaunchPlan(kind="gpu", devices=(0, 1), n_workers=2, protocol="ucx")
    plan = harness.BenchRun(options=Options.resolve(), launch=gpu, inventory=None,
                            workloads=workloads.select("W1,W3,O3,O4,B1,B2"), scale="small", runs=3, timeout=60)
    split = [(list(changes), [w.name for w in ws]) for changes, ws in harness.groups(plan)]
    two, three = ["spillway", "baseline"], ["spillway", "tasks_method", "baseline"]
    assert split == [(two, ["W1", "W3"]), (three, ["O3"]), (three, ["O4"]), (two, ["B1"]), (two, ["B2"])]
    # tasks_method is spillway's cluster: it gets spillway's options changes
    b2_like = dataclasses.replace(workloads.WORKLOADS["O3"], gpu_cluster={"device_memory_limit": "12GB"},
                                  spillway_cluster={"small": {"pinned_pool_size": "1GB"}})
    assert b2_like.cluster_changes("small", "gpu", "tasks_method") == b2_like.cluster_changes("small", "gpu",
                                                                                              "spillway")
    assert b2_like.cluster_changes("small", "gpu", "baseline") == {"device_memory_limit": "12GB"}


# --- the command on CPU clusters: the CI's tiny run


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_o3_o4_on_cpu_clusters_three_sides_checked_and_compared_with_before(tmp_path):
    from matplotlib import image

    machine = report.describe_machine(None, "cpu")["name"]
    o3 = workloads.WORKLOADS["O3"]
    # an earlier result of this machine: O3's spillway side 1000x faster, O4 never ran
    earlier = {"machine": {"name": machine}, "sizes": "tiny", "runs": 3, "started": "2026-01-01T00:00:00+00:00",
               "finished": "2026-01-01T00:01:00+00:00", "label": None,
               "workloads": [{"name": "O3", "spillway_s": 1e-4, "input_bytes": o3.input_bytes("tiny"),
                              "chunk_bytes": o3.chunk_bytes("tiny"),
                              "spillway": {"median_s": 1e-4, "first_s": 1e-4}}]}
    (tmp_path / f"{machine}-2026-01-01T000000Z.json").write_text(json.dumps(earlier))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["bench", "--cpu", "--n-workers", "2", "--only", "O3,O4", "--sizes", "tiny",
                                       "--no-ceilings", "--out", str(out), "--previous", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("*.json")
    data = json.loads(path.read_text())
    assert [w["name"] for w in data["workloads"]] == ["O3", "O4"]
    assert set(data["clusters"]) == {"spillway", "tasks_method", "baseline"}
    for w in data["workloads"]:
        fields = {s: set(w[s]) for s in ("spillway", "tasks_method", "baseline")}
        assert fields["spillway"] == fields["tasks_method"] == fields["baseline"]
        for side in ("spillway", "tasks_method", "baseline"):
            d = w[side]
            assert d["error"] is None and d["first_s"] > 0 and len(d["runs_s"]) == 3
            assert d["verify"]["ok"] and max(d["verify"]["rel_errors"]) <= 1e-10
            # no rate between CPU workers: the bound names what it misses (where a tiny run's
            # chunks all happened to be where they were needed, nothing moved)
            if d["bytes_moved"]:
                assert d["bound_s"] is None and d["tiers_bound"]["missing"] == ["peer_copy"]
            else:
                assert d["bound_s"] == 0 and d["tiers_bound"]["missing"] == []
            assert w["out_of_core"]["sides"][side]["first_s"] == d["first_s"]
        assert w["tasks_method"]["rechunk_method"] == "tasks"
        assert w["spillway"]["rechunk_method"] == "step"  # spillway's cluster took it
        assert w["tasks_method_s"] == w["tasks_method"]["median_s"]
        assert w["out_of_core"]["spillway_over_tasks_method"] == pytest.approx(
            w["spillway"]["median_s"] / w["tasks_method"]["median_s"])
        assert w["out_of_core"]["first_spillway_over_tasks_method"] == pytest.approx(
            w["spillway"]["first_s"] / w["tasks_method"]["first_s"])
    # against the earlier file: O3 slower on spillway's side, the rest of O3 and all of O4 new
    assert data["previous"]["file"].endswith(f"{machine}-2026-01-01T000000Z.json")
    assert {(r["name"], r["side"], r["metric"]) for r in data["slower"]} == {
        ("O3", "spillway", "median_s"), ("O3", "spillway", "first_s")}
    new = {(r["name"], r["side"], r["metric"]) for r in data["new"]}
    assert ("O4", "baseline", "first_s") in new and ("O3", "tasks_method", "median_s") in new
    assert ("O3", "spillway", "median_s") not in new
    md = path.with_suffix(".md").read_text()
    assert "## Out of core, fresh clusters" in md and "| O4 | tasks_method | tasks |" in md
    assert "## Against the previous result" in md and "| O3 spillway first run |" in md
    assert image.imread(path.with_suffix(".png")).std() > 0.01
    assert "out of core, a fresh cluster per side:" in result.stdout
    # a cluster started for each side of each row, and the first run on it recorded
    log = path.with_suffix(".log").read_text()
    for side in ("spillway", "tasks_method", "baseline"):
        assert log.count(f"starting the {side} cluster") == 2
        for w in data["workloads"]:
            assert f"{w['name']} {side:<8} first run " in log
            # the first run measured as the timed ones are (where the inputs landed decides
            # how much moved: nothing at all is possible)
            assert w[side]["first_s"] == w[side]["warmup_s"] and w[side]["first_bytes_moved"] >= 0
    last = result.stderr.strip().splitlines()
    assert any(line.startswith("slower: O3 spillway first run: ") for line in last[-3:])
    assert "failed workloads" not in result.output


@pytest.mark.parametrize("name", O_ROWS)
def test_one_h200_footprint_is_capped_by_its_host(name):
    """One H200 (141 GB) on a 128 GiB host with a 64 GiB disk: 2.5x would put about 135 GB
    on that disk; the footprint is the GPU's memory and three quarters of the host's."""
    device, host = 141 * 10**9, 128 * 2**30
    w = workloads.WORKLOADS[name].for_machine(device, 1, 1, host)
    cap = device + 0.75 * host
    assert cap <= w.footprint_bytes("full") < cap * 1.05
    # a host with room leaves the factor as it is (one H100 on a 251 GiB host)
    roomy = workloads.WORKLOADS[name].for_machine(80 * 10**9, 1, 1, 251 * 2**30)
    assert roomy.params("full") == workloads.WORKLOADS[name].for_machine(80 * 10**9, 1, 1).params("full")


def _gpus(*free_gb: float) -> Inventory:
    from spillway.options.gpus import GPU

    return Inventory(tuple(GPU(index=i, uuid=f"GPU-{i}", name="H200", memory_total=int(150.8e9),
                               memory_free=int(f * 1e9), pci_bus_id=f"0000:{i:02x}:00.0")
                           for i, f in enumerate(free_gb)))


def test_a_side_waits_for_the_gpus_the_previous_side_held_and_says_it():
    """O4's task-method side started while the GPUs were still held and failed on it: each
    side now waits (bounded) until the GPUs are back to what they had free at the start."""
    from spillway_bench.clusters import wait_for_gpus

    at_start = _gpus(150.1, 150.1)
    reads = iter([_gpus(20.9, 22.0), _gpus(90.0, 150.0), _gpus(149.6, 150.1)])
    said: list[str] = []
    waited = wait_for_gpus(at_start, (0, 1), said.append, wait_s=30, read=lambda: next(reads))
    assert waited >= 1.0  # two reads half a second apart before the third found them back
    assert said == [f"waited {waited:.1f} s for the GPUs the previous cluster held"]

    said.clear()
    assert wait_for_gpus(at_start, (0, 1), said.append, wait_s=30, read=lambda: _gpus(150.0, 149.0)) < 1
    assert said == []  # back at once: within the slack, nothing to say


def test_gpus_still_held_are_said_with_their_numbers_and_the_side_goes_on():
    from spillway_bench.clusters import wait_for_gpus

    said: list[str] = []
    wait_for_gpus(_gpus(150.1, 150.1), (1,), said.append, wait_s=0.6, read=lambda: _gpus(150.1, 22.0))
    (line,) = said
    assert re.fullmatch(r"GPUs still held after \d+ s: GPU 1 22\.0 GB free of 150\.8 GB \(150\.1 GB at the start\)",
                        line), line
