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

from dask_array_suite import MODULES, SHARDED, in_shard, shared_id  # noqa: E402
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
