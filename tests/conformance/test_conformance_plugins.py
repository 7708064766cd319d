"""The conformance plugins' CPU side: dask's ``assert_eq`` computes on the cluster inside
their block and on dask's sync scheduler outside it, the scheduler counts the tasks each
test ran, the routines' shards split one way everywhere, and the array plugin's run
fails exactly for the tests that fail on its cluster and not on the control."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

HERE = Path(__file__).parent
# --import-mode=importlib puts no test folder on sys.path: the plugins' modules are found
# as pytest's -p finds them, on the path
sys.path.insert(0, str(HERE))

from dask_array_suite import (  # noqa: E402
    CI_MODULES, CI_SHARES, CONTROL_FAILURES, MODULES, NOT_RUN, SHARDED, control_failure, in_shard, shared_id,
    varies_on_control)
from on_cluster import assert_eq_on_cluster, count_tasks, take_counts, wait_released  # noqa: E402


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        count_tasks(c)
        yield c


def test_assert_eq_computes_on_the_cluster_inside_the_block_only(client):
    from dask.array.utils import assert_eq

    x = da.arange(100, chunks=10) * 2
    take_counts(client)
    assert_eq(x, np.arange(100) * 2)
    assert take_counts(client)["ran"] == 0  # dask's default: the sync scheduler
    with assert_eq_on_cluster():
        assert_eq(x, np.arange(100) * 2)
        wait_released(client)
        assert take_counts(client)["ran"] >= 20  # the chunks, and again for the chunk check
        assert_eq(x, np.arange(100) * 2, scheduler="sync")  # a test's own scheduler stays
        assert take_counts(client)["ran"] == 0
    assert_eq(x, np.arange(100) * 2)
    assert take_counts(client)["ran"] == 0


def test_the_counts_tell_errors_from_tasks_run(client):
    def boom(block):
        raise ZeroDivisionError("boom")

    x = da.ones(4, chunks=2).map_blocks(boom, dtype=float)
    take_counts(client)
    with pytest.raises(ZeroDivisionError):
        client.compute(x).result(timeout=60)
    counts = take_counts(client)
    assert counts["erred"] >= 1


def test_shards_split_the_sharded_modules_once_and_keep_the_others_whole():
    names = [f"dask/array/tests/test_routines.py::test_{i}" for i in range(400)]
    shards = [[n for n in names if in_shard(n, f"{k}/3")] for k in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(names)
    assert all(60 < len(s) < 200 for s in shards), [len(s) for s in shards]
    other = "dask/array/tests/test_rechunk.py::test_rechunk_1d"
    assert all(in_shard(other, f"{k}/3") for k in (1, 2, 3))
    assert shared_id(".venv/lib/python3.11/site-packages/" + names[0]) == names[0]
    assert all(s.removesuffix(".py").replace("/", ".") in MODULES for s in SHARDED)
    with pytest.raises(ValueError):
        in_shard(names[0], "4/3")


def test_ci_runs_shard_one_of_its_shared_modules_and_the_others_whole():
    for module, n in CI_SHARES.items():
        assert module.removesuffix(".py").replace("/", ".") in CI_MODULES
        names = [f"{module}::test_{i}[{i % 7}]" for i in range(800)]
        ci = [name for name in names if in_shard(name, "ci")]
        assert 800 / n / 2 < len(ci) < 800 / n * 2, (module, len(ci))
        if module in SHARDED:
            assert ci == [name for name in names if in_shard(name, f"1/{n}")]
        assert ci == [name for name in names if in_shard(name, "ci")]  # the same tests each run
    whole = "dask/array/tests/test_overlap.py::test_map_overlap"
    assert whole.split("::")[0] not in CI_SHARES and in_shard(whole, "ci")


def test_the_rest_is_every_test_ci_leaves_out_once():
    for module in MODULES:
        path = module.replace(".", "/") + ".py"
        names = [f"{path}::test_{i}[{i % 7}]" for i in range(800)]
        ci = {name for name in names if in_shard(name, "ci")}
        rest = {name for name in names if in_shard(name, "rest")}
        assert not ci & rest and ci | rest == set(names), module
        n = CI_SHARES.get(path, 1)
        if n == 1:
            assert not rest, module  # CI runs it whole
        elif path in SHARDED:  # shards 2 to N
            assert rest == {name for name in names if any(in_shard(name, f"{k}/{n}") for k in range(2, n + 1))}
        else:
            assert 800 * (n - 1) / n / 2 < len(rest) < 800, module


def test_a_control_failure_named_by_its_function_covers_its_cases_only():
    linalg = "dask/array/tests/test_linalg.py::"
    assert control_failure(linalg + "test_tsqr[20-10-chunks2-None]") == CONTROL_FAILURES[linalg + "test_tsqr"]
    assert control_failure(linalg + "test_tsqr_uncertain[300-10-chunks0-True-True-None]")
    assert control_failure(linalg + "test_tsqr_zero_height_chunks") is None
    assert control_failure(linalg + "test_lu_1") is None
    exact = "dask/array/tests/test_routines.py::test_average_raises"
    assert control_failure(exact) == CONTROL_FAILURES[exact]
    # only a function named whole varies: its cases are not compared with the control's
    assert varies_on_control(linalg + "test_qr[10-10-10-None]")
    assert not varies_on_control(exact) and not varies_on_control(linalg + "test_lu_1")
    # every name is one of the suite's modules' (a typo would excuse nothing, silently)
    for name in [*CONTROL_FAILURES, *NOT_RUN]:
        assert name.split("::")[0].removesuffix(".py").replace("/", ".") in MODULES, name


SUITE = """
def test_passes():
    assert True

def test_fails_here_and_on_the_control():
    assert False

def test_fails_here_only():
    from dask.array.utils import assert_eq
    import dask.array as da
    assert_eq(da.ones(4, chunks=2), da.zeros(4, chunks=2))
"""


@pytest.mark.parametrize("control_fails_too, code", [(False, 1), (True, 0)])
def test_the_run_fails_for_a_test_failing_here_and_passing_on_the_control(tmp_path, control_fails_too, code):
    (tmp_path / "test_suite.py").write_text(SUITE)
    control = tmp_path / "control.json"
    failed = ["test_suite.py::test_fails_here_and_on_the_control"]
    if control_fails_too:
        failed.append("test_suite.py::test_fails_here_only")
    control.write_text(json.dumps({"outcomes": {name: "failed" for name in failed}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    # the control's cluster, measured against a control's outcomes: the verdict is the same
    # on spillway's, which starts slower
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "dask_array_conformance", "-p", "no:cacheprovider",
         "-o", "addopts=", "--rootdir", str(tmp_path), "--array-conformance=control",
         f"--conformance-control={control}", f"--conformance-outcomes={tmp_path / 'here.json'}", "test_suite.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == code, result.stdout + result.stderr
    written = json.loads((tmp_path / "here.json").read_text())
    assert written["outcomes"] == {"test_suite.py::test_passes": "passed",
                                   "test_suite.py::test_fails_here_and_on_the_control": "failed",
                                   "test_suite.py::test_fails_here_only": "failed"}
    # assert_eq computed on the cluster: its chunks' tasks were counted for the test
    assert written["tasks"]["test_suite.py::test_fails_here_only"]["ran"] > 0
