"""`spillway.local`: the embedded cluster of a notebook, on CPU workers here."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

from reference_inputs import uniform_numpy
import spillway
from spillway import OptionsError, ParamError
from spillway.run.report import Report
from spillway.clusters.local import Local
from spillway.launch import scheduler_workers
from spillway.workflows import random

sys.path.insert(0, str(Path(__file__).parents[1] / "service" / "api"))
from serve_helpers import wait_for  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    with spillway.local(cpu=True, n_workers=2, dashboard_address="127.0.0.1:0") as lc:
        yield lc


def rel_error(computed, expected) -> float:
    return float(np.linalg.norm(np.asarray(computed, np.float64) - expected) / np.linalg.norm(expected))


def test_bad_options_are_refused_before_anything_starts():
    with pytest.raises(OptionsError, match="n-workers: 0 must be >= 1"):
        spillway.local(cpu=True, n_workers=0)
    with pytest.raises(OptionsError, match="nworkers: not a spillway option \\(did you mean n_workers\\?\\)"):
        spillway.local(nworkers=2)


def test_options_come_from_the_one_options_object(cluster, monkeypatch):
    assert isinstance(cluster, Local)
    assert cluster.options.sources["n_workers"] == "keyword" and cluster.options.n_workers == 2
    assert cluster.kind == "cpu" and cluster.n_workers == 2
    assert len(scheduler_workers(cluster.client)) == 2
    assert cluster.dashboard_link.startswith("http://127.0.0.1:")
    assert cluster.worker_bytes > 0
    html = cluster._repr_html_()
    assert "2 cpu (tcp)" in html and cluster.dashboard_link in html
    assert [w["name"] for w in cluster.workflows()][:3] == ["elementwise", "fft", "gather"]


def test_run_a_workflow_against_numpy(cluster):
    stream = io.StringIO()
    report = cluster.run("transpose-sum", {"size": "800x800"}, chunks="200x200", seed=5, verify=True,
                         progress=stream)
    assert isinstance(report, Report) and report["cluster"]["n_workers"] == 2
    a = uniform_numpy((800, 800), seed=5, dtype="float64")
    expected = float((a + a.T).sum())
    assert abs(report["result"]["sum"] - expected) / abs(expected) < 1e-10
    assert report["verify"]["ok"] is True
    assert "100%" in stream.getvalue() and "transpose-sum" in stream.getvalue()
    assert report["bytes_transferred"] > 0  # mirrored chunks crossed between the two workers


def test_run_with_the_default_bar_outside_jupyter(cluster, capsys):
    # long enough (hundreds of tasks) for the bar, which appears once the tasks arrive
    report = cluster.run("reduction", op="std", size="1500x1500", chunks="100x100", verify=True)
    assert report["verify"]["ok"] is True and report["tasks"] > 300
    # stderr here is captured, not a terminal: a redirected log gets no \r updates
    err = capsys.readouterr().err
    assert "\r" not in err and "reduction:" not in err, err
    # a stream asked for gets tqdm's text bar
    import sys

    report = cluster.run("reduction", op="std", size="1500x1500", chunks="100x100", progress=sys.stderr)
    err = capsys.readouterr().err
    assert "reduction: 100%" in err and f"{report['tasks']}/{report['tasks']}" in err, err


def test_refused_parameters_raise_and_draw_no_bar(cluster, capsys):
    with pytest.raises(ParamError, match="size: 300x200 is not square"):
        cluster.run("transpose-sum", size="300x200")
    with pytest.raises(ParamError, match="workflow 'transpose-summ' is unknown"):
        cluster.run("transpose-summ")
    assert capsys.readouterr().err == ""


def test_own_arrays_into_a_workflow_and_computed_directly(cluster):
    x = da.random.default_rng(2).random((600, 600), chunks=150)
    host = x.compute(scheduler="sync")
    report = cluster.run("transpose-sum", arrays={"x": x}, verify=True, progress=False)
    assert report["verify"]["ok"] is True
    assert abs(report["result"]["sum"] - (host + host.T).sum()) / abs((host + host.T).sum()) < 1e-10

    trace = cluster.compute((x @ x.T).trace(), progress=False)
    assert abs(trace - np.einsum("ij,ij->", host, host)) / trace < 1e-10
    total, column_means = cluster.compute(x.sum(), x.mean(axis=0))
    assert abs(total - host.sum()) / host.sum() < 1e-12
    assert rel_error(column_means, host.mean(axis=0)) < 1e-12


def test_array_output_read_back_lazily(cluster, tmp_path):
    out = tmp_path / "rows.zarr"
    report = cluster.run("slice", size="1000x400", chunks="100x100", step=3, output=str(out), progress=False)
    assert report["output"] == str(out) and report["bytes_written"] == sum(  # measured from the chunk files
        f.stat().st_size for f in out.rglob("*") if f.is_file() and f.name != "zarr.json")
    rows = cluster.open(str(out))
    assert dask.is_dask_collection(rows) and rows.shape == (334, 400)
    expected = uniform_numpy((1000, 400), seed=0, dtype="float64")[::3]
    assert rel_error(rows.compute(), expected) <= 1e-12


def test_an_interrupt_cancels_the_run_and_the_cluster_carries_on(cluster):
    """The notebook's stop button (SIGINT in the kernel) while a workflow runs: its tasks
    are cancelled, the interrupt reaches the caller, and the next run works."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)
        with pytest.raises(KeyboardInterrupt):
            cluster.run("transpose-sum", size="8000x8000", chunks="100x100", progress=io.StringIO())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not cluster.client.futures
    wait_for(lambda: not any(cluster.client.processing().values()), 30, "the cancelled tasks to stop")
    report = cluster.run("transpose-sum", size="400x400", chunks="100x100", verify=True, progress=False)
    assert report["verify"]["ok"] is True


def test_close_stops_the_cluster():
    with spillway.local(cpu=True, n_workers=1, dashboard_address="127.0.0.1:0") as lc:
        client = lc.client
        assert lc.compute(da.ones(10, chunks=5).sum(), progress=False) == 10
    assert client.status == "closed"


@pytest.mark.gpu
def test_local_on_gpus_runs_cupy_chunks(tmp_path, gpu_count):
    import cupy

    with spillway.local(dashboard_address="127.0.0.1:0") as lc:
        assert lc.kind == "gpu" and lc.n_workers == gpu_count
        report = lc.run("transpose-sum", size="20000x20000", verify=True, progress=False)
        assert report["verify"]["ok"] is True and report["cluster"]["kind"] == "gpu"
        lc.run("slice", size="20000x20000", step=50, output=str(tmp_path / "rows.zarr"), progress=False)
        rows = lc.open(str(tmp_path / "rows.zarr"))
        assert isinstance(rows._meta, cupy.ndarray)
        got = cupy.asnumpy(rows[:4].compute())
        expected = np.concatenate([random.uniform_block(0, 0, (20000, 20000), ((r, r + 1), (0, 20000)), "float64",
                                                        "numpy") for r in range(0, 200, 50)])
        assert rel_error(got, expected) <= 1e-12


def test_sessions_rechunk_through_the_collective_unless_the_user_chose():
    from spillway.clusters.base import session_config

    assert session_config({"array": {"rechunk": {"method": None}}}) == {"array.rechunk.method": "p2p"}
    assert session_config({"array": {"rechunk": {"method": "tasks"}}}) == {}


def test_every_kind_of_cluster_takes_the_collective_while_open_and_gives_the_setting_back():
    # the base class sets it, so spillway.slurm() and an attached cluster take the same
    # path as spillway.local(); a stand-in session, as Slurm's needs sbatch
    import contextlib
    import types

    import dask.config

    from spillway.clusters.base import Cluster

    with dask.config.set({"array.rechunk.method": None}):
        stack = contextlib.ExitStack()
        cluster = Cluster(types.SimpleNamespace(options=None), stack)
        assert dask.config.get("array.rechunk.method") == "p2p"
        stack.close()
        assert dask.config.get("array.rechunk.method") is None
        with dask.config.set({"array.rechunk.method": "tasks"}):
            stack = contextlib.ExitStack()
            Cluster(types.SimpleNamespace(options=None), stack)
            assert dask.config.get("array.rechunk.method") == "tasks"
            stack.close()
    del cluster


def test_a_cpu_session_rechunks_through_the_collective():
    import dask.array as da
    import dask.config

    with spillway.local(cpu=True, n_workers=2, dashboard_address=None) as lc:
        assert dask.config.get("array.rechunk.method") == "p2p"
        x = da.random.default_rng(3).random((400, 300), chunks=(50, 300)).persist()
        y = x.rechunk((400, 30))
        assert any(name.startswith(("spillway-cut-", "spillway-step-")) for name in y.dask.layers)
        assert np.array_equal(y.compute(), x.compute())
        # the pieces were all taken: nothing is left in the workers' stores
        left = lc.client.run(lambda dask_worker: [k for k in dask_worker.data if str(k).startswith("('spillway-")])
        assert not any(left.values())
        client = lc.client
    # closed, the session's cluster no longer takes the collective (the module's own
    # cluster may still be open, so dask's name may still be routed for it)
    from spillway.datapath.collective import method

    assert client not in method._SESSIONS
